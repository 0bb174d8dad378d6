#pragma once
// Private: the CUDA implementation of Backend (tensor/backend.h). Host code per family in
// cuda_backend*.cc (argument layout, temporaries, cuBLASLt); kernels in cuda_*.cu behind the
// launchers of cuda_kernels.h. Every kernel runs on the current stream of its tensors' device
// and never synchronises; bad index values surface at the next synchronisation (see
// cuda_runtime.h). Stateless apart from cuBLASLt handles and algorithm caches; thread-safe.

#include "tessel/tensor/backend.h"

namespace tessel::cuda {

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  // cuda_backend.cc
  void copy(const Tensor& src, const Tensor& dst) override;
  void copy_device(const Tensor& src, const Tensor& dst, bool non_blocking) override;
  void fill(const Tensor& dst, double value) override;
  void arange(const Tensor& dst, double start, double step) override;
  void random(const Tensor& dst, RandomDistribution dist, double a, double b, uint64_t seed,
              uint64_t offset) override;
  void unary(UnaryOp op, const Tensor& x, const Tensor& out) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) override;
  // cuda_backend_reduce.cc
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims,
              const Tensor& out) override;
  void argmax(const Tensor& x, int64_t dim, const Tensor& out) override;
  // cuda_backend_nn.cc
  void softmax(const Tensor& x, const Tensor& out, bool log) override;
  void softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                        bool log) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  const Tensor& out, const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                           const Tensor& grad_weight, const Tensor& grad_bias) override;
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                const Tensor& rstd) override;
  void rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& rstd, const Tensor& grad_x,
                         const Tensor& grad_weight) override;
  void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) override;
  void embedding_backward(const Tensor& grad, const Tensor& indices,
                          const Tensor& grad_weight) override;
  void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     const Tensor& loss, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& target,
                              const Tensor& lse, int64_t ignore_index,
                              const Tensor& grad_logits) override;
  // cuda_backend_optim.cc
  void adamw_step(std::span<const AdamWTensors> tensors, const AdamWHyper& hyper) override;
  // cuda_matmul.cc (cuBLASLt)
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  // The bias added in cuBLASLt's epilogue (no pass of its own).
  void addmm(const Tensor& bias, const Tensor& a, const Tensor& b, const Tensor& out) override;
};

CudaBackend& cuda_backend();

}  // namespace tessel::cuda
