#include "tessel/nn/optim/optimizer.h"

#include "tessel/base/error.h"

namespace tessel::nn::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)) {
  set_lr(lr);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TESSEL_CHECK(p.defined() && p.dtype() == DType::kF32 && p.is_contiguous(), InvalidArgument,
                 "optimizer parameter {} must be a contiguous f32 tensor, got {}", i,
                 p.defined() ? p.str() : "an undefined tensor");
  }
}

void Optimizer::set_lr(double lr) {
  TESSEL_CHECK(lr >= 0, InvalidArgument, "learning rate must be >= 0, got {}", lr);
  lr_ = lr;
}

void Optimizer::set_step_count(int64_t count) {
  TESSEL_CHECK(count >= 0, InvalidArgument, "optimizer step count must be >= 0, got {}", count);
  step_count_ = count;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state(size_t i) const {
  TESSEL_CHECK(i < params_.size(), OutOfRange, "optimizer state of parameter {}: it has {}", i,
               params_.size());
  return {};
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

Tensor Optimizer::checked_grad(size_t i) const {
  const Tensor& p = params_[i];
  Tensor g = p.grad();
  if (!g.defined()) return g;
  TESSEL_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.is_contiguous() &&
                   g.device() == p.device(),
               InvalidArgument,
               "gradient of parameter {} is {} but the parameter is {} (needs the same shape, "
               "dtype and device, contiguous)",
               i, g.str(), p.str());
  return g;
}

}  // namespace tessel::nn::optim
