#pragma once
// The math backend on CUDA: reference attention that materializes the S_q x S_k scores of one
// (batch entry, head) at a time in f32 device scratch — plain CUDA cores, no tensor cores, f32
// accumulation throughout. The oracle of the GPU tests and the dispatcher's last resort for
// CUDA tensors: f32, bf16 and f16; any head dim and strides; every mask (a predicate through
// the host-evaluated block mask of flash_cuda_plan.h) and dropout. Memory: S_q * S_k floats
// (two such buffers in backward) plus O(S) per call.

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

// True when this build has the CUDA kernels.
bool math_cuda_is_available();

// out = softmax(scale q k^T + mask) v with dropout, lse (contiguous (B, H_q, S_q) f32 on the
// device, may be null). Issues kernels on the current stream of the tensors' device. Throws
// InvalidArgument on a bad problem or output, Unavailable without CUDA.
void math_cuda_forward(const AttentionProblem& problem, const AttentionView& out, float* lse);

// dq, dk, dv of the forward above for output gradient dout (recomputes everything).
void math_cuda_backward(const AttentionProblem& problem, const AttentionView& dout,
                        const AttentionView& dq, const AttentionView& dk, const AttentionView& dv);

}  // namespace tessel::kernels::attention
