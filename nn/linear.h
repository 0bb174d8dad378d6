#pragma once
// Linear: y = x W^T + b, with W (out_features, in_features), as torch.nn.Linear.

#include <cstdint>

#include "tessel/nn/module.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
};

// Parameters "weight" (out, in) and, with bias, "bias" (out), initialised uniformly in
// +-1/sqrt(in) from `gen` (the default generator when null), as PyTorch does.
// Thread-safety and ownership: as Module.
class Linear : public Module {
 public:
  // Throws InvalidArgument for sizes below 1.
  explicit Linear(const LinearOptions& options, Generator* gen = nullptr);
  // x (..., in) -> (..., out).
  Tensor forward(const Tensor& x) override;

  const Tensor& weight() const { return *weight_; }
  // Undefined without bias.
  Tensor bias() const { return bias_ ? *bias_ : Tensor(); }

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
};

// Uniform in [-bound, bound) from gen (the default generator when null).
Tensor uniform_init(const Shape& shape, double bound, Generator* gen);
// Normal with mean 0 and standard deviation std from gen (the default generator when null).
Tensor normal_init(const Shape& shape, double std, Generator* gen);

}  // namespace tessel::nn
