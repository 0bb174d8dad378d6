#pragma once
// Normalisation layers over the last dimension: LayerNorm and RMSNorm.

#include <cstdint>

#include "tessel/nn/module.h"

namespace tessel::nn {

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (torch.nn.LayerNorm).
// Parameters "weight" (ones) and, with bias, "bias" (zeros), each (dim).
class LayerNorm : public Module {
 public:
  // Throws InvalidArgument for dim < 1.
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) override;

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
  double eps_;
};

// x / sqrt(mean(x^2) + eps) * weight over the last dim (torch.nn.RMSNorm). Parameter
// "weight" (ones), (dim).
class RMSNorm : public Module {
 public:
  // Throws InvalidArgument for dim < 1.
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;

 private:
  Tensor* weight_;
  double eps_;
};

}  // namespace tessel::nn
