#include "tessel/nn/optim/sgd.h"

#include "tessel/base/error.h"

namespace tessel::nn::optim {

Sgd::Sgd(std::vector<Tensor> params, const SgdOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options), momentum_(params_.size()) {
  TESSEL_CHECK(options.momentum >= 0 && options.weight_decay >= 0, InvalidArgument,
               "SGD momentum {} and weight decay {} must be >= 0", options.momentum,
               options.weight_decay);
  TESSEL_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
               InvalidArgument,
               "Nesterov momentum needs momentum > 0 and dampening 0, got momentum {} "
               "dampening {}",
               options.momentum, options.dampening);
}

void Sgd::step() {
  const float lr = static_cast<float>(lr_);
  const float wd = static_cast<float>(options_.weight_decay);
  const float mu = static_cast<float>(options_.momentum);
  const float keep = static_cast<float>(1.0 - options_.dampening);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor grad = checked_grad(i);
    if (!grad.defined()) continue;
    float* p = params_[i].data<float>();
    const float* g = grad.data<float>();
    const int64_t n = params_[i].numel();
    if (mu == 0.0f) {
      for (int64_t k = 0; k < n; ++k) p[k] -= lr * (g[k] + wd * p[k]);
      continue;
    }
    const bool first = !momentum_[i].defined();
    if (first) momentum_[i] = zeros(params_[i].shape());
    float* buf = momentum_[i].data<float>();
    for (int64_t k = 0; k < n; ++k) {
      const float d = g[k] + wd * p[k];
      buf[k] = first ? d : mu * buf[k] + keep * d;
      p[k] -= lr * (options_.nesterov ? d + mu * buf[k] : buf[k]);
    }
  }
  ++step_count_;
}

}  // namespace tessel::nn::optim
