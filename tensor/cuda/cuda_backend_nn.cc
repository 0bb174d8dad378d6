// The CUDA backend's host code for the neural-net kernels (softmax, norms, embedding,
// cross-entropy) and the fused AdamW step: shapes as rows and columns, scratch memory from the
// caching allocator on the current stream, then the launchers of cuda_kernels.h.
#include <cmath>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda_backend.h"
#include "tessel/tensor/cuda/cuda_runtime.h"

namespace tessel::cuda {
namespace {

// Rows and columns of a row-wise op over the last dim (a scalar is one row of one).
std::pair<int64_t, int64_t> rows_cols(const Tensor& t) {
  const int64_t cols = t.dim() == 0 ? 1 : t.size(-1);
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
float* f32_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

}  // namespace

void CudaBackend::softmax(const Tensor& x, const Tensor& out, bool log) {
  const auto [rows, cols] = rows_cols(x);
  DeviceScope s(x.device());
  launch_softmax(s.launch, x.data_ptr(), out.data_ptr(), x.dtype(), rows, cols, log);
}

void CudaBackend::softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                                   bool log) {
  const auto [rows, cols] = rows_cols(y);
  DeviceScope s(y.device());
  launch_softmax_backward(s.launch, grad_y.data_ptr(), y.data_ptr(), grad_x.data_ptr(), y.dtype(),
                          rows, cols, log);
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                             const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const auto [rows, cols] = rows_cols(x);
  DeviceScope s(x.device());
  launch_norm(s.launch, x.data_ptr(), data_or_null(weight), data_or_null(bias), out.data_ptr(),
              mean.data<float>(), rstd.data<float>(), x.dtype(), rows, cols,
              static_cast<float>(eps));
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                           const Tensor& rstd) {
  const auto [rows, cols] = rows_cols(x);
  DeviceScope s(x.device());
  launch_norm(s.launch, x.data_ptr(), data_or_null(weight), nullptr, out.data_ptr(), nullptr,
              rstd.data<float>(), x.dtype(), rows, cols, static_cast<float>(eps));
}

namespace {

// Both norms' backward: grad_x row by row, then the per-feature parameter gradients.
void norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const Tensor& mean,
                   const Tensor& rstd, const Tensor& grad_x, const Tensor& grad_weight,
                   const Tensor& grad_bias) {
  const auto [rows, cols] = rows_cols(x);
  DeviceScope s(x.device());
  const float* m = mean.defined() ? mean.data<float>() : nullptr;
  if (grad_x.defined()) {
    launch_norm_backward_input(s.launch, grad_y.data_ptr(), x.data_ptr(), data_or_null(weight), m,
                               rstd.data<float>(), grad_x.data_ptr(), x.dtype(), rows, cols);
  }
  if (grad_weight.defined() || grad_bias.defined()) {
    const Scratch tmp(norm_backward_params_scratch_bytes(rows, cols), x.device());
    launch_norm_backward_params(s.launch, grad_y.data_ptr(), x.data_ptr(), m, rstd.data<float>(),
                                f32_or_null(grad_weight), f32_or_null(grad_bias), x.dtype(), rows,
                                cols, tmp.get());
  }
}

}  // namespace

void CudaBackend::layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                      const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                                      const Tensor& grad_weight, const Tensor& grad_bias) {
  norm_backward(grad_y, x, weight, mean, rstd, grad_x, grad_weight, grad_bias);
}

void CudaBackend::rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                    const Tensor& rstd, const Tensor& grad_x,
                                    const Tensor& grad_weight) {
  norm_backward(grad_y, x, weight, Tensor(), rstd, grad_x, grad_weight, Tensor());
}

void CudaBackend::embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DeviceScope s(weight.device());
  launch_embedding(s.launch, weight.data_ptr(), static_cast<int>(weight.element_size()),
                   indices.data<int64_t>(), out.data_ptr(), indices.numel(), weight.size(0),
                   weight.size(1));
}

void CudaBackend::embedding_backward(const Tensor& grad, const Tensor& indices,
                                     const Tensor& grad_weight) {
  TESSEL_CHECK(is_floating(grad.dtype()), InvalidArgument,
               "embedding_backward needs a floating-point gradient, got {}",
               dtype_name(grad.dtype()));
  const int64_t n = indices.numel();
  DeviceScope s(grad.device());
  const Scratch tmp(embedding_backward_scratch_bytes(n, grad_weight.size(0)), grad.device());
  launch_embedding_backward(s.launch, grad.data_ptr(), grad.dtype(), indices.data<int64_t>(),
                            grad_weight.data<float>(), n, grad_weight.size(0), grad_weight.size(1),
                            tmp.get());
}

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                const Tensor& loss, const Tensor& lse) {
  DeviceScope s(logits.device());
  launch_cross_entropy(s.launch, logits.data_ptr(), logits.dtype(), target.data<int64_t>(),
                       ignore_index, loss.data<float>(), lse.data<float>(), logits.size(0),
                       logits.size(1));
}

void CudaBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits,
                                         const Tensor& target, const Tensor& lse,
                                         int64_t ignore_index, const Tensor& grad_logits) {
  DeviceScope s(logits.device());
  launch_cross_entropy_backward(
      s.launch, grad_loss.data<float>(), logits.data_ptr(), logits.dtype(), target.data<int64_t>(),
      lse.data<float>(), ignore_index, grad_logits.data_ptr(), logits.size(0), logits.size(1));
}

void CudaBackend::adamw_step(std::span<const AdamWTensors> tensors, const AdamWHyper& hyper) {
  if (tensors.empty()) return;
  // The step's scalars exactly as the CPU kernel computes them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), hyper.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), hyper.step);
  AdamWScalars sc;
  sc.lr_decay = 1.0f - hyper.lr * hyper.weight_decay;
  sc.beta1 = hyper.beta1;
  sc.beta2 = hyper.beta2;
  sc.step_size = static_cast<float>(hyper.lr / bc1);
  sc.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  sc.eps = hyper.eps;
  std::vector<AdamWSlice> slices;
  slices.reserve(tensors.size());
  const Device device = tensors[0].param.device();
  for (const AdamWTensors& t : tensors) {
    TESSEL_CHECK(t.param.device() == device, InvalidArgument,
                 "adamw_step: parameters on {} and {} in one call", device.str(),
                 t.param.device().str());
    slices.push_back({t.param.data<float>(), t.grad.data<float>(), t.exp_avg.data<float>(),
                      t.exp_avg_sq.data<float>(), t.param.numel()});
  }
  DeviceScope s(device);
  launch_adamw(s.launch, slices.data(), static_cast<int>(slices.size()), sc);
}

}  // namespace tessel::cuda
