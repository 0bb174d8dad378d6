#pragma once
// The cuDNN backend: cuDNN's fused flash attention (scaled dot-product attention) through
// cudnn-frontend's Graph API, forward and backward, for CUDA tensors in bf16 or f16. Graphs are
// built once per shape, layout and mask and cached; q, k, v, out and the gradients are handed
// to cuDNN in place through their strides (no copies).
//
// What cuDNN runs here: head dims up to 128 that are multiples of 8 (cuDNN 9 on sm_80/sm_90),
// causal masks in either alignment, sliding windows (left bound; right bound 0 or unbounded
// with causal), grouped-query heads, dropout with cuDNN's own Philox stream (so its mask
// differs from the other backends'), a deterministic backward. Not: prefix-LM, documents and
// predicates (flash_cuda runs those).

#include <string>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

// True when this build has cuDNN and cudnn-frontend.
bool cudnn_sdpa_is_available();

// Empty when the cuDNN backend can run `problem` (validated), else the reason naming what it
// supports. Asks the device for its compute capability (cached).
std::string cudnn_sdpa_unsupported_reason(const AttentionProblem& problem);

// out (like q) and lse ((B, H_q, S_q) f32 on the device, natural log). Issues work on the
// current stream of the tensors' device. Throws InvalidArgument for unsupported problems (the
// message says what is supported), Unavailable without cuDNN, and cuDNN's message on failure.
void cudnn_sdpa_forward(const AttentionProblem& problem, const AttentionView& out, float* lse);

void cudnn_sdpa_backward(const AttentionProblem& problem, const AttentionView& out,
                         const AttentionView& dout, const float* lse, const AttentionView& dq,
                         const AttentionView& dk, const AttentionView& dv);

}  // namespace tessel::kernels::attention
