#pragma once
// The math backend: reference attention that materializes the (S_q x S_k) score matrix per
// head, computed with BLAS GEMMs in f32 or f64. It is the oracle for every fused backend's
// tests and the unfused baseline in bench/attention_cpu. Memory: O(S_q * S_k) per call.

#include <cstdint>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

struct MathOptions {
  // Accumulate (GEMMs, softmax, reductions) in f64 instead of f32.
  bool f64_accumulate = false;
  // With bf16 inputs, round the scores, probabilities and their gradients to bf16 between the
  // steps, as an unfused bf16 composition of tensor ops does. This is "the math backend's own
  // bf16 error" of FlashAttention's test rule.
  bool round_intermediates = false;
};

// out = softmax(scale * q k^T + mask) v with dropout; lse[b, h, i] (contiguous (B, H_q, S_q),
// natural log; -inf for a fully masked row) unless lse is null. Blocking; single call at a
// time per output. Throws InvalidArgument on a bad problem or output.
void math_attention_forward(const AttentionProblem& problem, const AttentionView& out, float* lse,
                            const MathOptions& options = {});

// Gradients of the forward above for output gradient dout; recomputes everything from q, k, v
// (needs neither out nor lse). dq like q, dk/dv like k/v (summed over each key/value head's
// query-head group).
void math_attention_backward(const AttentionProblem& problem, const AttentionView& dout,
                             const AttentionView& dq, const AttentionView& dk,
                             const AttentionView& dv, const MathOptions& options = {});

}  // namespace tessel::kernels::attention
