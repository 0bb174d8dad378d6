#include "tessel/kernels/llama/swiglu.h"

#include <cmath>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::kernels {
namespace {

constexpr int64_t kGrain = 1 << 14;

template <typename T>
void swiglu_forward_typed(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const T* g = gate.data<T>();
  const T* u = up.data<T>();
  T* o = out.data<T>();
  parallel_for(0, gate.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float a = static_cast<float>(g[i]);
      o[i] = T(a / (1.0f + std::exp(-a)) * static_cast<float>(u[i]));
    }
  });
}

template <typename T>
void swiglu_backward_typed(const Tensor& grad, const Tensor& gate, const Tensor& up,
                           const Tensor& grad_gate, const Tensor& grad_up) {
  const T* dy = grad.data<T>();
  const T* g = gate.data<T>();
  const T* u = up.data<T>();
  T* dg = grad_gate.data<T>();
  T* du = grad_up.data<T>();
  parallel_for(0, gate.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float a = static_cast<float>(g[i]), d = static_cast<float>(dy[i]);
      const float s = 1.0f / (1.0f + std::exp(-a));
      dg[i] = T(d * static_cast<float>(u[i]) * s * (1.0f + a * (1.0f - s)));
      du[i] = T(d * a * s);
    }
  });
}

template <typename Fn>
void dispatch_floating(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: fn(float{}); break;
    case DType::kBF16: fn(BFloat16{}); break;
    case DType::kF16: fn(Half{}); break;
    default:
      throw InvalidArgument(fmt::format("swiglu: unsupported dtype {}", dtype_name(dtype)));
  }
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  TESSEL_CHECK(gate.shape() == up.shape() && gate.dtype() == up.dtype() &&
                   is_floating(gate.dtype()) && gate.device() == up.device(),
               InvalidArgument, "swiglu expects floating gate and up of one shape, dtype and "
               "device, got {} and {}", gate.str(), up.str());
  if (!gate.device().is_cpu()) return swiglu_reference(gate, up);
  return apply_function(
      "swiglu", {gate, up},
      [](FunctionContext& ctx, const std::vector<Tensor>& in) {
        const Tensor g = contiguous(in[0]), u = contiguous(in[1]);
        Tensor out = empty(g.shape(), g.dtype(), g.device());
        dispatch_floating(g.dtype(), [&](auto tag) {
          swiglu_forward_typed<decltype(tag)>(g, u, out);
        });
        ctx.save_for_backward({g, u});
        return std::vector<Tensor>{out};
      },
      [](FunctionContext& ctx, const std::vector<Tensor>& grad) {
        const Tensor& g = ctx.saved_tensors()[0];
        const Tensor& u = ctx.saved_tensors()[1];
        const Tensor dy = contiguous(to(grad[0], g.dtype()));
        Tensor dg = empty(g.shape(), g.dtype(), g.device());
        Tensor du = empty(g.shape(), g.dtype(), g.device());
        dispatch_floating(g.dtype(), [&](auto tag) {
          swiglu_backward_typed<decltype(tag)>(dy, g, u, dg, du);
        });
        return std::vector<Tensor>{dg, du};
      })[0];
}

Tensor swiglu_reference(const Tensor& gate, const Tensor& up) { return mul(silu(gate), up); }

}  // namespace tessel::kernels
