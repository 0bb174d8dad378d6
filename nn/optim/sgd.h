#pragma once
// Stochastic gradient descent with momentum, dampening, weight decay and Nesterov momentum,
// with PyTorch's torch.optim.SGD arithmetic.

#include <vector>

#include "tessel/nn/optim/optimizer.h"

namespace tessel::nn::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
};

// Per parameter with gradient g:
//   g += wd * p
//   buf = g (first step) or momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf       (when momentum != 0)
//   p -= lr * g
// Thread-safety: as Optimizer.
class Sgd : public Optimizer {
 public:
  // Throws InvalidArgument for negative momentum or weight decay, or Nesterov without
  // momentum or with dampening.
  Sgd(std::vector<Tensor> params, const SgdOptions& options);
  void step() override;

  const SgdOptions& options() const { return options_; }

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;  // undefined until the parameter's first step
};

}  // namespace tessel::nn::optim
