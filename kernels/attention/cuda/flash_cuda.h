#pragma once
// flash_cuda: FlashAttention-2 on NVIDIA tensor cores, forward and backward, for CUDA tensors
// (built for sm_80 and sm_90a; mma.sync m16n8k16 through inline PTX, no CUTLASS).
//
//   AttentionProblem p = ...;                  // views of CUDA memory, bf16 or f16
//   flash_cuda_forward(p, out, lse);           // lse: (B, H_q, S_q) f32 on the device
//   flash_cuda_backward(p, out, dout, lse, dq, dk, dv);
//
// Supports: bf16 and f16 inputs with f32 accumulation; head dims 64 and 128 (any multiple of 8
// up to 128, zero-padded); any strides with a contiguous last dimension and 16-byte aligned
// rows (a (B, S, H, D) tensor permuted to (B, H, S, D) is read in place); grouped-query and
// multi-query heads; causal masks in either alignment; sliding windows; prefix-LM; documents
// (variable-length sequences packed in one batch entry); predicates (evaluated on the host
// into a block mask, see flash_cuda_plan.h); dropout (the same Philox mask as every backend).
// Memory: forward none beyond out and lse; backward an f32 row sum per query row, unless
// deterministic an f32 dQ accumulator (S_q x D per head), and under GQA/MQA f32 partial dK and
// dV per query head (2 x S_k x D per query head) — never S_q x S_k.
//
// Backward: one CTA per (key block of 128, batch entry, head) keeps dK and dV in registers over
// every query block of its head. Without GQA the head is the key/value head and the CTA writes
// dK and dV; under GQA/MQA it is a query head — the query heads of a group run in parallel, not
// one after another in one CTA — and writes its partial dK, dV to the workspace, which a last
// kernel sums over each group in head order. dQ is accumulated with f32 atomics (fast; float
// sums in arrival order), or — AttentionProblem::deterministic — by a second kernel per query
// block that recomputes the scores, so every gradient is bitwise reproducible (about 1.4x the
// backward's work).
//
// Calls issue kernels on the current stream (tensor/stream.h) of the tensors' device and return
// without waiting; scratch comes from the device's caching allocator (tensor/storage.h).

#include <string>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

// True when this build has the CUDA kernels (they still need a device to run).
bool flash_cuda_is_available();

// The compute capability (major * 10 + minor, e.g. 90) of CUDA device `index`, or 0 when it
// cannot be read (no such device, no CUDA in this build). Cached per device.
int cuda_compute_capability(int index);

// out (like q, same dtype) and lse (contiguous (B, H_q, S_q) f32 on the device, natural log,
// -inf for rows that see no key; may be null). Throws InvalidArgument when the problem or out
// is not supported (the message names what is), Unavailable without CUDA, and the CUDA error of
// a failed launch.
void flash_cuda_forward(const AttentionProblem& problem, const AttentionView& out, float* lse);

// dq, dk, dv (like q, k, v) for output gradient dout, given forward's out and lse of the same
// problem (same dropout seed and offset). Throws as forward.
void flash_cuda_backward(const AttentionProblem& problem, const AttentionView& out,
                         const AttentionView& dout, const float* lse, const AttentionView& dq,
                         const AttentionView& dk, const AttentionView& dv);

}  // namespace tessel::kernels::attention
