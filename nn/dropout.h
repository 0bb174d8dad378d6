#pragma once
// Dropout: zeroes elements with probability p while training and scales the rest by
// 1 / (1 - p); the identity in eval mode or when p is 0 (torch.nn.Dropout).

#include "tessel/nn/module.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {

class Dropout : public Module {
 public:
  // Throws InvalidArgument unless 0 <= p < 1. Masks come from `gen` (not owned; the default
  // generator when null).
  explicit Dropout(double p, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // Where the masks come from (activation checkpointing replays its offsets).
  Generator& generator() const { return gen_ != nullptr ? *gen_ : default_generator(); }
  double p() const { return p_; }

 private:
  double p_;
  Generator* gen_;
};

}  // namespace tessel::nn
