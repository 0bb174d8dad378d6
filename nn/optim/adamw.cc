#include "tessel/nn/optim/adamw.h"

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/tensor/backend.h"

namespace tessel::nn::optim {

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  TESSEL_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
               InvalidArgument, "AdamW betas ({}, {}) must lie in [0, 1)", options.beta1,
               options.beta2);
  TESSEL_CHECK(options.eps >= 0 && options.weight_decay >= 0, InvalidArgument,
               "AdamW eps {} and weight decay {} must be >= 0", options.eps, options.weight_decay);
  for (const Tensor& p : params_) {
    exp_avg_.push_back(zeros(p.shape(), DType::kF32, p.device()));
    exp_avg_sq_.push_back(zeros(p.shape(), DType::kF32, p.device()));
  }
}

std::vector<std::pair<std::string, Tensor>> AdamW::state(size_t i) const {
  TESSEL_CHECK(i < params_.size(), OutOfRange, "AdamW state of parameter {}: it has {}", i,
               params_.size());
  return {{"exp_avg", exp_avg_[i]}, {"exp_avg_sq", exp_avg_sq_[i]}};
}

void AdamW::step() {
  // One fused kernel call per device, parameters in their order.
  std::vector<std::pair<Device, std::vector<AdamWTensors>>> by_device;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor grad = checked_grad(i);
    if (!grad.defined()) continue;
    const Device device = params_[i].device();
    auto it = std::find_if(by_device.begin(), by_device.end(),
                           [&](const auto& entry) { return entry.first == device; });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {device, {}});
    it->second.push_back({params_[i], grad, exp_avg_[i], exp_avg_sq_[i]});
  }
  ++step_count_;
  AdamWHyper hyper;
  hyper.lr = static_cast<float>(lr_);
  hyper.beta1 = static_cast<float>(options_.beta1);
  hyper.beta2 = static_cast<float>(options_.beta2);
  hyper.eps = static_cast<float>(options_.eps);
  hyper.weight_decay = static_cast<float>(options_.weight_decay);
  hyper.step = step_count_;
  for (const auto& [device, tensors] : by_device) backend_for(device).adamw_step(tensors, hyper);
}

}  // namespace tessel::nn::optim
