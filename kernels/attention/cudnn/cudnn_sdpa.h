#pragma once
// The cuDNN backend: cuDNN's fused flash attention (scaled dot-product attention) through
// cudnn-frontend's Graph API, forward and backward, for CUDA tensors in bf16 or f16. Graphs are
// built once per shape, layout, mask and direction, when that direction first runs, and cached;
// q, k, v, out and the gradients are handed to cuDNN in place through their strides (no copies).
//
// What cuDNN runs here: head dims up to 128 that are multiples of 8 (cuDNN 9 on sm_80/sm_90),
// causal masks in either alignment, sliding windows (left bound; right bound 0 or unbounded
// with causal), grouped-query heads, a deterministic backward while its S_q x S_k workspace
// stays small. Not: dropout (cuDNN draws its own mask), prefix-LM, documents and predicates.
// What it declines — by the rules of cudnn_sdpa_support.h or its graphs' support check —
// flash_cuda runs instead when the dispatcher chose cudnn (sdpa_backend.h).

#include <string>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/cudnn/cudnn_sdpa_support.h"

namespace tessel::kernels::attention {

// True when this build has cuDNN and cudnn-frontend.
bool cudnn_sdpa_is_available();

// Empty when the cuDNN backend can run the forward of `problem` (validated), else the reason
// naming what it supports: cuDNN's rules (cudnn_sdpa_support.h), then the support check of the
// forward graph, built now and cached (never the backward graph: an inference call builds
// none). Asks the device for its compute capability (cached).
std::string cudnn_sdpa_unsupported_reason(const AttentionProblem& problem);

// The same for the backward with these outputs and gradients (their strides key the graph):
// builds the backward graph on the first backward of a shape. The dispatcher runs flash_cuda's
// backward when this is not empty (deterministic backwards cuDNN declines, graphs it cannot
// build), recording the reason (cudnn_sdpa_fallbacks()).
std::string cudnn_sdpa_backward_unsupported_reason(const AttentionProblem& problem,
                                                   const AttentionView& out,
                                                   const AttentionView& dout,
                                                   const AttentionView& dq, const AttentionView& dk,
                                                   const AttentionView& dv);

// How many graphs of `direction` this process has built (failed builds count; 0 without cuDNN).
int64_t cudnn_sdpa_graph_builds(SdpaDirection direction);

// out (like q) and lse ((B, H_q, S_q) f32 on the device, natural log). Issues work on the
// current stream of the tensors' device. Throws InvalidArgument for problems the reasons above
// decline (the message says what is supported), Unavailable without cuDNN, and cuDNN's message
// on failure: these run exactly what they are given (the dispatcher does the falling back).
void cudnn_sdpa_forward(const AttentionProblem& problem, const AttentionView& out, float* lse);

void cudnn_sdpa_backward(const AttentionProblem& problem, const AttentionView& out,
                         const AttentionView& dout, const float* lse, const AttentionView& dq,
                         const AttentionView& dk, const AttentionView& dv);

}  // namespace tessel::kernels::attention
