#include "tessel/kernels/llama/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/cuda/llama_cuda.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::kernels {
namespace {

// Checks x (B, T, H, D) against tables (T, D/2) or (B, T, D/2); returns whether the tables
// carry a batch dim.
bool check_rope_shapes(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  TESSEL_CHECK(x.dim() == 4 && is_floating(x.dtype()) && x.size(3) % 2 == 0, InvalidArgument,
               "rope expects a floating x (B, T, H, D) with even D, got {}", x.str());
  const int64_t B = x.size(0), T = x.size(1), half = x.size(3) / 2;
  TESSEL_CHECK(cos.shape() == sin.shape() && cos.dtype() == DType::kF32 &&
                   sin.dtype() == DType::kF32 &&
                   (cos.shape() == Shape{T, half} || cos.shape() == Shape{B, T, half}),
               InvalidArgument,
               "rope expects f32 cos and sin of shape ({}, {}) or ({}, {}, {}) for x {}, got {} "
               "and {}",
               T, half, B, T, half, shape_str(x.shape()), cos.str(), sin.str());
  TESSEL_CHECK(cos.device() == x.device() && sin.device() == x.device(), InvalidArgument,
               "rope: x on {} but cos on {} and sin on {}", x.device().str(), cos.device().str(),
               sin.device().str());
  return cos.dim() == 3;
}

// out = rotate(x) by (cos, sign * sin); x, out contiguous (B, T, H, D), tables contiguous.
template <typename T>
void rope_cpu_typed(const Tensor& x, const Tensor& cos, const Tensor& sin, float sign,
                    bool batched_tables, const Tensor& out) {
  const int64_t B = x.size(0), S = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const T* xp = x.data<T>();
  T* op = out.data<T>();
  const float* cp = cos.data<float>();
  const float* sp = sin.data<float>();
  parallel_for(0, B * S, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, H * D)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t row = begin; row < end; ++row) {
                   const int64_t table_row = batched_tables ? row : row % S;
                   const float* c = cp + table_row * half;
                   const float* s = sp + table_row * half;
                   for (int64_t h = 0; h < H; ++h) {
                     const T* xi = xp + (row * H + h) * D;
                     T* oi = op + (row * H + h) * D;
                     for (int64_t i = 0; i < half; ++i) {
                       const float x1 = static_cast<float>(xi[i]);
                       const float x2 = static_cast<float>(xi[i + half]);
                       const float si = sign * s[i];
                       oi[i] = T(x1 * c[i] - x2 * si);
                       oi[i + half] = T(x2 * c[i] + x1 * si);
                     }
                   }
                 }
               });
}

// The fused rotation on the CPU or, for CUDA tensors, rope_cuda.cu.
Tensor rope_fused(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in, float sign,
                  bool batched_tables) {
  const Tensor x = contiguous(x_in), cos = contiguous(cos_in), sin = contiguous(sin_in);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.device().is_cuda()) {
    rope_cuda(x, cos, sin, sign, out);
    return out;
  }
  switch (x.dtype()) {
    case DType::kF32:
      rope_cpu_typed<float>(x, cos, sin, sign, batched_tables, out);
      break;
    case DType::kBF16:
      rope_cpu_typed<BFloat16>(x, cos, sin, sign, batched_tables, out);
      break;
    case DType::kF16:
      rope_cpu_typed<Half>(x, cos, sin, sign, batched_tables, out);
      break;
    default:
      throw InvalidArgument(fmt::format("rope: unsupported dtype {}", dtype_name(x.dtype())));
  }
  return out;
}

}  // namespace

Tensor rope_inv_freq(int64_t head_dim, double theta, const std::optional<RopeScaling>& scaling) {
  TESSEL_CHECK(head_dim > 0 && head_dim % 2 == 0, InvalidArgument,
               "rope needs a positive even head_dim, got {}", head_dim);
  TESSEL_CHECK(theta > 0, InvalidArgument, "rope needs theta > 0, got {}", theta);
  if (scaling) {
    TESSEL_CHECK(scaling->factor > 0 && scaling->high_freq_factor > scaling->low_freq_factor &&
                     scaling->low_freq_factor > 0 && scaling->original_max_position_embeddings > 0,
                 InvalidArgument,
                 "llama3 rope scaling needs factor > 0 (got {}), 0 < low_freq_factor ({}) < "
                 "high_freq_factor ({}) and original_max_position_embeddings > 0 (got {})",
                 scaling->factor, scaling->low_freq_factor, scaling->high_freq_factor,
                 scaling->original_max_position_embeddings);
  }
  const int64_t half = head_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (scaling) {
      // Hugging Face's _compute_llama3_parameters, element by element.
      const double old_len = static_cast<double>(scaling->original_max_position_embeddings);
      const double low_freq_wavelen = old_len / scaling->low_freq_factor;
      const double high_freq_wavelen = old_len / scaling->high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= scaling->factor;  // low frequencies: stretched
      } else if (wavelen >= high_freq_wavelen) {
        // The band between: interpolated between stretched and kept.
        const double smooth = (old_len / wavelen - scaling->low_freq_factor) /
                              (scaling->high_freq_factor - scaling->low_freq_factor);
        f = (1.0 - smooth) * f / scaling->factor + smooth * f;
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return to(from_vector<float>(out, {half}), Device::cpu());
}

RopeTables rope_tables(const Tensor& positions, const Tensor& inv_freq) {
  TESSEL_CHECK((positions.dim() == 1 || positions.dim() == 2) && !is_floating(positions.dtype()),
               InvalidArgument, "rope_tables expects integer positions (T) or (B, T), got {}",
               positions.str());
  TESSEL_CHECK(inv_freq.dim() == 1 && inv_freq.dtype() == DType::kF32, InvalidArgument,
               "rope_tables expects f32 inv_freq (D/2), got {}", inv_freq.str());
  Shape shape = positions.shape();
  shape.push_back(inv_freq.size(0));
  if (positions.is_meta()) {
    return {empty(shape, DType::kF32, positions.device()),
            empty(shape, DType::kF32, positions.device())};
  }
  const std::vector<int64_t> pos =
      to_vector<int64_t>(to(to(positions, Device::cpu()), DType::kI64));
  const std::vector<float> freq = to_vector<float>(to(inv_freq, Device::cpu()));
  const size_t half = freq.size();
  std::vector<float> c(pos.size() * half), s(pos.size() * half);
  for (size_t p = 0; p < pos.size(); ++p) {
    for (size_t i = 0; i < half; ++i) {
      // The f32 angle, as Hugging Face's f32 matmul of positions and frequencies gives it.
      const float angle = static_cast<float>(pos[p]) * freq[i];
      c[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      s[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return {to(from_vector<float>(c, shape), positions.device()),
          to(from_vector<float>(s, shape), positions.device())};
}

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const bool batched = check_rope_shapes(x, cos, sin);
  if (!x.device().is_cpu() && !x.device().is_cuda()) return rope_reference(x, cos, sin);
  const Tensor c = detach(cos), s = detach(sin);
  return apply_function(
      "rope", {x},
      [c, s, batched](FunctionContext&, const std::vector<Tensor>& in) {
        return std::vector<Tensor>{rope_fused(in[0], c, s, 1.0f, batched)};
      },
      [c, s, batched](FunctionContext&, const std::vector<Tensor>& grad) {
        // The rotation is orthogonal: its gradient is the inverse rotation (sin negated).
        return std::vector<Tensor>{rope_fused(grad[0], c, s, -1.0f, batched)};
      })[0];
}

Tensor rope_reference(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const bool batched = check_rope_shapes(x, cos, sin);
  (void)batched;
  const int64_t half = x.size(3) / 2;
  // (T, D) or (B, T, D) -> broadcast over heads: (T, 1, D) or (B, T, 1, D).
  const Tensor c = unsqueeze(to(cat({cos, cos}, -1), x.dtype()), -2);
  const Tensor s = unsqueeze(to(cat({sin, sin}, -1), x.dtype()), -2);
  const Tensor rotated = cat({neg(narrow(x, 3, half, half)), narrow(x, 3, 0, half)}, 3);
  return add(mul(x, c), mul(rotated, s));
}

}  // namespace tessel::kernels
