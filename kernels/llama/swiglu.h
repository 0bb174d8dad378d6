#pragma once
// SwiGLU's gate: silu(gate) * up, the pointwise middle of Llama's MLP, fused on the CPU and CUDA.

#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

// silu(gate) * up for gate and up of one shape and floating dtype (any strides), computed in
// f32 and rounded once to their dtype. Differentiable in both. On the CPU and on CUDA one fused
// pass forward and one backward (d gate = g * up * s * (1 + gate * (1 - s)), d up = g *
// silu(gate), s = sigmoid(gate); CUDA: llama/cuda/swiglu_cuda.cu, on the device's current
// stream); elsewhere swiglu_reference. Blocks on the CPU. Throws InvalidArgument for mismatched
// shapes or dtypes.
Tensor swiglu(const Tensor& gate, const Tensor& up);

// mul(silu(gate), up) op by op: the reference of the fused kernel.
Tensor swiglu_reference(const Tensor& gate, const Tensor& up);

}  // namespace tessel::kernels
