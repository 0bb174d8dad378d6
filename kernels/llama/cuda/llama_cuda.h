#pragma once
// The fused Llama kernels on CUDA (rope_cuda.cu, swiglu_cuda.cu): RoPE forward and backward and
// SwiGLU forward and backward, one pointwise pass each with f32 arithmetic, for f32, bf16 and
// f16. rope() and swiglu() (rope.h, swiglu.h) call them for CUDA tensors; in a build without
// CUDA a stub stands in (llama_cuda_stub.cc) and reports itself unavailable.

#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

// True when this build has the CUDA kernels.
bool llama_cuda_is_available();

// out = x rotated by (cos, sign * sin), as rope() defines it (sign -1: the inverse rotation,
// rope's backward). x and out contiguous (B, T, H, D) of one floating dtype; cos and sin
// contiguous f32 (T, D/2) or (B, T, D/2); all on one CUDA device. Issues one kernel on the
// device's current stream and returns without waiting. Throws InvalidArgument for other
// shapes, dtypes, layouts or devices, Unavailable without CUDA.
void rope_cuda(const Tensor& x, const Tensor& cos, const Tensor& sin, float sign,
               const Tensor& out);

// out = silu(gate) * up, for gate, up and out contiguous of one shape and floating dtype on one
// CUDA device. Stream and errors as rope_cuda.
void swiglu_cuda_forward(const Tensor& gate, const Tensor& up, const Tensor& out);

// grad_gate and grad_up of out = silu(gate) * up for the output gradient grad; all five
// contiguous of one shape and floating dtype on one CUDA device. Stream and errors as rope_cuda.
void swiglu_cuda_backward(const Tensor& grad, const Tensor& gate, const Tensor& up,
                          const Tensor& grad_gate, const Tensor& grad_up);

}  // namespace tessel::kernels
