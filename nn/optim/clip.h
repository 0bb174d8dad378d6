#pragma once
// Global gradient-norm clipping (torch.nn.utils.clip_grad_norm_).

#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::nn::optim {

// Computes the L2 norm of all gradients of `params` taken together (parameters without a
// gradient are skipped; each gradient's sum of squares in f32 on its device, in a fixed order)
// and, when it exceeds max_norm, scales every gradient in place by max_norm / (norm + 1e-6).
// Returns the norm before clipping (reading it waits for the devices). A non-finite norm leaves
// the gradients as they are (the caller decides to skip the step). Gradients may be on any
// device and of any floating dtype; max_norm > 0 (InvalidArgument otherwise).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace tessel::nn::optim
