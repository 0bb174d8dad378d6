#include "tessel/nn/rope.h"

#include "tessel/base/error.h"

namespace tessel::nn {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta,
                                 const std::optional<kernels::RopeScaling>& scaling)
    : Module("RotaryEmbedding"), inv_freq_(kernels::rope_inv_freq(head_dim, theta, scaling)) {}

Tensors RotaryEmbedding::forward_multi(const Tensors& inputs) {
  TESSEL_CHECK(inputs.size() == 1, InvalidArgument,
               "RotaryEmbedding takes one input (positions), got {}", inputs.size());
  kernels::RopeTables t = kernels::rope_tables(inputs[0], inv_freq_);
  return {t.cos, t.sin};
}

}  // namespace tessel::nn
