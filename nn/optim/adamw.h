#pragma once
// AdamW (decoupled weight decay) with a fused multi-tensor step: one backend kernel per device
// updates every parameter (Backend::adamw_step; on the CPU, chunks shared among threads), like
// PyTorch's torch.optim.AdamW(fused=True).

#include <vector>

#include "tessel/nn/optim/optimizer.h"

namespace tessel::nn::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// Thread-safety: as Optimizer. The moments are f32 tensors the size of each parameter, on its
// device, allocated (zeroed) at construction.
class AdamW : public Optimizer {
 public:
  // Throws InvalidArgument for betas outside [0, 1), a negative eps or weight decay.
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  // Every parameter with a gradient advances together; the bias correction uses step_count().
  void step() override;

  const AdamWOptions& options() const { return options_; }
  // The moments of params()[i] (for checkpoints and tests).
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  // {"exp_avg", exp_avg(i)}, {"exp_avg_sq", exp_avg_sq(i)}.
  std::vector<std::pair<std::string, Tensor>> state(size_t i) const override;

 private:
  AdamWOptions options_;
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
};

}  // namespace tessel::nn::optim
