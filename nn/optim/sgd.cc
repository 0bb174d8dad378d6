#include "tessel/nn/optim/sgd.h"

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

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
  NoGradGuard no_grad;  // the update is not part of any graph
  const double mu = options_.momentum;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor grad = checked_grad(i);
    if (!grad.defined()) continue;
    Tensor& p = params_[i];
    Tensor d = options_.weight_decay != 0 ? add(grad, mul(p, options_.weight_decay)) : grad;
    if (mu != 0) {
      Tensor& buf = momentum_[i];
      if (!buf.defined()) {
        buf = clone(d);
      } else {
        mul_(buf, mu);
        add_(buf, d, 1.0 - options_.dampening);
      }
      d = options_.nesterov ? add(d, mul(buf, mu)) : buf;
    }
    add_(p, d, -lr_);
  }
  ++step_count_;
}

}  // namespace tessel::nn::optim
