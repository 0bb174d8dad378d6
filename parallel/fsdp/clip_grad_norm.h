#pragma once
// Gradient clipping by the global norm over parameters that may be shards (fully_shard,
// tensor-parallel styles): the mesh-aware counterpart of nn::optim::clip_grad_norm.

#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel {

// clip_grad_norm over parameters that may be shards: each gradient's sum of squares, summed over
// the mesh dimensions the parameter is sharded on (an all_reduce per distinct group), gives the
// global norm on every rank; scales as nn::optim::clip_grad_norm does. Collective.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// clip_grad_norm's norm, squared, without scaling anything: each gradient's sum of squares,
// summed over the mesh dimensions its parameter is sharded on. Collective as clip_grad_norm
// (pp::clip_grad_norm sums it over the pipeline's stages too).
double grad_sum_of_squares(const std::vector<Tensor>& params);

}  // namespace tessel
