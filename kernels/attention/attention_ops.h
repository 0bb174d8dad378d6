#pragma once
// Plain attention composed of tensor ops (matmul, masked softmax, matmul), for devices that
// have no fused attention kernel (CUDA until its flash kernels are registered): the math
// backend runs it for problems whose memory is not the CPU's. The (S_q x S_k) scores are
// materialised in f32 for all heads at once: memory O(B H S_q S_k).
//
// Supports dense and causal masks (either alignment, as long as every query sees a key) and
// grouped heads; windows, prefixes, documents, mask predicates and dropout are refused (see
// ops_attention_unsupported).

#include <string>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

// Empty when the ops path can run `problem`, else the reason.
std::string ops_attention_unsupported(const AttentionProblem& problem);

// As math_attention_forward, issued on the device's current stream (no synchronisation).
// With bf16 inputs the products are bf16 GEMMs (f32 accumulation) and the softmax runs in f32.
void ops_attention_forward(const AttentionProblem& problem, const AttentionView& out, float* lse);

// Gradients from the forward's output and the output gradient (the probabilities are
// recomputed).
void ops_attention_backward(const AttentionProblem& problem, const AttentionView& out,
                            const AttentionView& dout, const AttentionView& dq,
                            const AttentionView& dk, const AttentionView& dv);

}  // namespace tessel::kernels::attention
