#pragma once
// The optimizer base: a list of parameters updated in place from their gradients.
//
//   AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
//   loss.backward(); clip_grad_norm(model.parameters(), 1.0); opt.step(); opt.zero_grad();
//
// Parameters are contiguous f32 tensors on any device (each step runs on the parameter's device,
// on its current stream); a parameter whose grad() is undefined is skipped (as in PyTorch).
// Thread-safety: none; one thread steps an optimizer.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::nn::optim {

class Optimizer {
 public:
  // Throws InvalidArgument naming the parameter index when one is not a contiguous f32
  // tensor, or when lr is negative.
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient. Throws InvalidArgument when a gradient
  // does not match its parameter's shape and dtype or is not contiguous.
  virtual void step() = 0;
  // Drops every parameter's gradient.
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  // Number of step() calls so far; set_step_count restores it from a checkpoint (throws
  // InvalidArgument when negative).
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t count);
  const std::vector<Tensor>& params() const { return params_; }

  // The state tensors of params()[i] by name (AdamW: "exp_avg", "exp_avg_sq"; each shaped like
  // the parameter), for checkpoints: handles of the optimizer's own tensors, so copying into
  // them restores the state. Empty for an optimizer that keeps none. Throws OutOfRange for i.
  virtual std::vector<std::pair<std::string, Tensor>> state(size_t i) const;

 protected:
  // The gradient of params()[i], checked against it; undefined when it has none.
  Tensor checked_grad(size_t i) const;

  std::vector<Tensor> params_;
  double lr_;
  int64_t step_count_ = 0;
};

}  // namespace tessel::nn::optim
