#include "tessel/nn/norm.h"

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

LayerNorm::LayerNorm(int64_t dim, double eps, bool bias) : Module("LayerNorm"), eps_(eps) {
  TESSEL_CHECK(dim > 0, InvalidArgument, "LayerNorm needs a positive dim, got {}", dim);
  weight_ = &register_parameter("weight", ones({dim}));
  if (bias) bias_ = &register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, *weight_, bias_ ? *bias_ : Tensor(), eps_);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : Module("RMSNorm"), eps_(eps) {
  TESSEL_CHECK(dim > 0, InvalidArgument, "RMSNorm needs a positive dim, got {}", dim);
  weight_ = &register_parameter("weight", ones({dim}));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, *weight_, eps_); }

}  // namespace tessel::nn
