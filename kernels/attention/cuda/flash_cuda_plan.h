#pragma once
// The host side of the CUDA attention kernels, free of CUDA headers (built and tested in every
// build): whether flash_cuda can run a problem, and the plan of one call — the kernel
// parameters over the problem's views and the mask resolved into arrays for the device.
//
// Masks: causal and sliding windows (either alignment) are evaluated by the kernels from three
// integers, per element only in the blocks the window cuts. Prefix lengths, documents and
// predicates are resolved here into a tile map of 64 x 64 (query x key) tiles — empty, full,
// partial — from which the kernels skip empty blocks and mask partial ones. Documents and
// prefixes are evaluated per element on the device (document ids as int32 arrays). A
// predicate (AttentionMask::mask_fn) is host code and cannot run on the GPU: it is called here
// for every element of every tile that the other parts leave non-empty — B * H_q * S_q * S_k
// calls at worst, spread over the CPU thread pool — and its tiles are stored as 512 bytes of
// bits each where they are neither empty nor full (1 bit per element: at most S_q * S_k / 8
// bytes per head, the one mask whose cost grows with S^2; FlexAttention compiles its mask into
// the kernel instead). Forward and backward each build the map again.

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/cuda/internal/flash_params.h"

namespace tessel::kernels::attention::cuda {

// The kernels' head dims; a smaller D (a multiple of 8) runs zero-padded in the next one.
inline constexpr int kMaxHeadDim = 128;

// A mask resolved for the kernels: the window part in `params`, and the arrays to copy to the
// device (empty when the mask needs none); point params at the copies with set_mask_arrays().
struct MaskPlan {
  MaskParams params;
  std::vector<int32_t> tiles;
  std::vector<uint64_t> bits;
  std::vector<int32_t> prefix, q_docs, kv_docs;
};

struct FlashPlan {
  FlashParams params;  // views, sizes, scales, dropout; params.mask = mask.params
  Elem elem = Elem::kBf16;
  int kernel_head_dim = 64;  // 64 or 128
  MaskPlan mask;
};

// Empty when flash_cuda can run `problem` (already validated), otherwise the reason, naming
// what flash_cuda supports: CUDA tensors, bf16 or f16, D <= 128 and a multiple of 8, a
// contiguous last dimension, 16-byte aligned rows, sizes within the launch grid.
std::string flash_cuda_unsupported_reason(const AttentionProblem& problem);

// The same checks without the device (the emulator runs plans over host memory).
std::string flash_cuda_layout_reason(const AttentionProblem& problem);

// Empty when `view` (an output or gradient) can be written by the kernels like `like`: the
// same dtype, a contiguous last dimension, 16-byte aligned rows.
std::string flash_cuda_output_reason(const AttentionView& view, const AttentionView& like,
                                     const char* what);

// The plan of one call over `problem`'s views (forward and backward alike; the caller fills in
// out, lse, dout, dq, dk, dv and the scratch pointers). Throws InvalidArgument with the reason
// above when the layout is unsupported.
FlashPlan make_flash_plan(const AttentionProblem& problem);

// The f32 elements of the backward's per-query-head dK/dV workspace under GQA/MQA (dk_accum
// then dv_accum, each B * H_q * S_k * kernel_head_dim): the query heads of a group compute
// their partial dK, dV in parallel, summed afterwards. 0 without GQA (dK, dV written directly).
int64_t flash_backward_dkdv_workspace_floats(const FlashPlan& plan);

// The mask of `problem` (already validated) resolved as described above; also used by the
// math backend on CUDA.
MaskPlan make_mask_plan(const AttentionProblem& problem);

// The dropout of `problem` in the kernels' terms (threshold 0 without dropout).
DropoutParams make_dropout_params(const AttentionProblem& problem);

// Points `params` at copies of the plan's arrays (null for empty ones).
void set_mask_arrays(MaskParams& params, const MaskPlan& plan, const int32_t* tiles,
                     const uint64_t* bits, const int32_t* prefix, const int32_t* q_docs,
                     const int32_t* kv_docs);

// A kernel view of `view`.
DeviceView device_view(const AttentionView& view);

}  // namespace tessel::kernels::attention::cuda
