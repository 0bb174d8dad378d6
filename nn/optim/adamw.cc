#include "tessel/nn/optim/adamw.h"

#include "tessel/base/error.h"
#include "tessel/kernels/optim/fused_adamw.h"

namespace tessel::nn::optim {

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  TESSEL_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                   options.beta2 < 1,
               InvalidArgument, "AdamW betas ({}, {}) must lie in [0, 1)", options.beta1,
               options.beta2);
  TESSEL_CHECK(options.eps >= 0 && options.weight_decay >= 0, InvalidArgument,
               "AdamW eps {} and weight decay {} must be >= 0", options.eps,
               options.weight_decay);
  for (const Tensor& p : params_) {
    exp_avg_.push_back(zeros(p.shape()));
    exp_avg_sq_.push_back(zeros(p.shape()));
  }
}

void AdamW::step() {
  std::vector<kernels::AdamWSlice> slices;
  slices.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor grad = checked_grad(i);
    if (!grad.defined()) continue;
    slices.push_back({params_[i].data<float>(), grad.data<float>(), exp_avg_[i].data<float>(),
                      exp_avg_sq_[i].data<float>(), params_[i].numel()});
  }
  ++step_count_;
  kernels::AdamWHyper hyper;
  hyper.lr = static_cast<float>(lr_);
  hyper.beta1 = static_cast<float>(options_.beta1);
  hyper.beta2 = static_cast<float>(options_.beta2);
  hyper.eps = static_cast<float>(options_.eps);
  hyper.weight_decay = static_cast<float>(options_.weight_decay);
  hyper.step = step_count_;
  kernels::fused_adamw_step(slices, hyper);
}

}  // namespace tessel::nn::optim
