#include "tessel/kernels/llama/swiglu.h"

#include <algorithm>
#include <array>
#include <type_traits>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/cuda/llama_cuda.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/cpu/cpu_isa.h"
#include "tessel/tensor/cpu/cpu_math.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::kernels {
namespace {

constexpr int64_t kGrain = 1 << 14;
constexpr int64_t kBlock = 1024;  // elements converted to f32 at a time (16-bit dtypes)

// The f32 loops, compiled per ISA so they vectorise (cpu::fast_sigmoid has no libm call).
TESSEL_ISA_CLONES void swiglu_f32(const float* __restrict g, const float* __restrict u,
                                  float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] * cpu::fast_sigmoid(g[i]) * u[i];
}

TESSEL_ISA_CLONES void swiglu_backward_f32(const float* __restrict dy, const float* __restrict g,
                                           const float* __restrict u, float* __restrict dg,
                                           float* __restrict du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = cpu::fast_sigmoid(g[i]);
    dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    du[i] = dy[i] * g[i] * s;
  }
}

// Runs fn(f32 pointers..., count) over [begin, end) of the `in` inputs and `out` outputs of type
// T: directly for f32, through f32 blocks for the 16-bit types.
template <typename T, size_t kIn, size_t kOut, typename Fn>
void run_blocks(const std::array<const T*, kIn>& in, const std::array<T*, kOut>& out, int64_t numel,
                Fn&& fn) {
  parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, float>) {
      std::array<const float*, kIn> fi;
      std::array<float*, kOut> fo;
      for (size_t k = 0; k < kIn; ++k) fi[k] = in[k] + begin;
      for (size_t k = 0; k < kOut; ++k) fo[k] = out[k] + begin;
      fn(fi, fo, end - begin);
    } else {
      float buf[kIn + kOut][kBlock];
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t n = std::min(kBlock, end - b);
        std::array<const float*, kIn> fi;
        std::array<float*, kOut> fo;
        for (size_t k = 0; k < kIn; ++k) {
          for (int64_t i = 0; i < n; ++i) buf[k][i] = static_cast<float>(in[k][b + i]);
          fi[k] = buf[k];
        }
        for (size_t k = 0; k < kOut; ++k) fo[k] = buf[kIn + k];
        fn(fi, fo, n);
        for (size_t k = 0; k < kOut; ++k) {
          for (int64_t i = 0; i < n; ++i) out[k][b + i] = T(buf[kIn + k][i]);
        }
      }
    }
  });
}

template <typename T>
void swiglu_forward_typed(const Tensor& gate, const Tensor& up, const Tensor& out) {
  run_blocks<T, 2, 1>(
      {gate.data<T>(), up.data<T>()}, {out.data<T>()}, gate.numel(),
      [](const auto& in, const auto& o, int64_t n) { swiglu_f32(in[0], in[1], o[0], n); });
}

template <typename T>
void swiglu_backward_typed(const Tensor& grad, const Tensor& gate, const Tensor& up,
                           const Tensor& grad_gate, const Tensor& grad_up) {
  run_blocks<T, 3, 2>({grad.data<T>(), gate.data<T>(), up.data<T>()},
                      {grad_gate.data<T>(), grad_up.data<T>()}, gate.numel(),
                      [](const auto& in, const auto& o, int64_t n) {
                        swiglu_backward_f32(in[0], in[1], in[2], o[0], o[1], n);
                      });
}

template <typename Fn>
void dispatch_floating(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(float{});
      break;
    case DType::kBF16:
      fn(BFloat16{});
      break;
    case DType::kF16:
      fn(Half{});
      break;
    default:
      throw InvalidArgument(fmt::format("swiglu: unsupported dtype {}", dtype_name(dtype)));
  }
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  TESSEL_CHECK(gate.shape() == up.shape() && gate.dtype() == up.dtype() &&
                   is_floating(gate.dtype()) && gate.device() == up.device(),
               InvalidArgument,
               "swiglu expects floating gate and up of one shape, dtype and "
               "device, got {} and {}",
               gate.str(), up.str());
  if (!gate.device().is_cpu() && !gate.device().is_cuda()) return swiglu_reference(gate, up);
  return apply_function(
      "swiglu", {gate, up},
      [](FunctionContext& ctx, const std::vector<Tensor>& in) {
        const Tensor g = contiguous(in[0]), u = contiguous(in[1]);
        Tensor out = empty(g.shape(), g.dtype(), g.device());
        if (g.device().is_cuda()) {
          swiglu_cuda_forward(g, u, out);
        } else {
          dispatch_floating(g.dtype(),
                            [&](auto tag) { swiglu_forward_typed<decltype(tag)>(g, u, out); });
        }
        ctx.save_for_backward({g, u});
        return std::vector<Tensor>{out};
      },
      [](FunctionContext& ctx, const std::vector<Tensor>& grad) {
        const Tensor& g = ctx.saved_tensors()[0];
        const Tensor& u = ctx.saved_tensors()[1];
        const Tensor dy = contiguous(to(grad[0], g.dtype()));
        Tensor dg = empty(g.shape(), g.dtype(), g.device());
        Tensor du = empty(g.shape(), g.dtype(), g.device());
        if (g.device().is_cuda()) {
          swiglu_cuda_backward(dy, g, u, dg, du);
        } else {
          dispatch_floating(
              g.dtype(), [&](auto tag) { swiglu_backward_typed<decltype(tag)>(dy, g, u, dg, du); });
        }
        return std::vector<Tensor>{dg, du};
      })[0];
}

Tensor swiglu_reference(const Tensor& gate, const Tensor& up) { return mul(silu(gate), up); }

}  // namespace tessel::kernels
