#pragma once
// Global gradient-norm clipping (torch.nn.utils.clip_grad_norm_).

#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::nn::optim {

// Computes the L2 norm of all gradients of `params` taken together (parameters without a
// gradient are skipped; accumulated in double) and, when it exceeds max_norm, scales every
// gradient in place by max_norm / (norm + 1e-6). Returns the norm before clipping. A
// non-finite norm leaves the gradients as they are (the caller decides to skip the step).
// Gradients must be contiguous f32 CPU tensors (InvalidArgument otherwise); max_norm > 0.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace tessel::nn::optim
