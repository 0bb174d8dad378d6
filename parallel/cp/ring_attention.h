#pragma once
// Ring attention over a `cp` group: each rank holds a slice of every sequence (a CpLayout);
// K/V blocks travel around the ring while each rank runs the fused attention kernel on the block
// in hand, and the partial outputs are merged with their log-sum-exps. Differentiable.
//
//   CpLayout layout = cp_layout_load_balanced(S, cp_group.size());
//   Tensor q_local = cp_shard_sequence(q, layout, cp_group.rank(), /*dim=*/2);   // same k, v
//   RingAttentionOutput r = ring_attention(cp_group, q_local, k_local, v_local, layout,
//                                          {.causal = true});
//   backward(loss_of(r.output));   // dq, dk, dv of this rank's slices
//
// Schedule (cp = n, rank r): at step s = 0..n-1 the rank holds the K/V block of rank r - s;
// while it attends to it, it sends the block to r + 1 and receives the next from r - 1
// (asynchronous ops issued before the compute). Every (query segment, key segment) pair is
// classified from global positions: entirely hidden by the causal mask (skipped, no compute),
// fully visible (no mask) or on the diagonal (causal). Backward re-runs the ring: the K/V block
// travels with its dK/dV accumulator; each rank adds its contribution computed by the kernel's
// backward with the merged output and log-sum-exp, and after the last step the accumulators go
// one hop further, home to their owners.

#include <cstdint>
#include <optional>

#include "tessel/collectives/process_group.h"
#include "tessel/kernels/attention/sdpa_backend.h"
#include "tessel/parallel/cp/sequence_shard.h"
#include "tessel/tensor/tensor.h"

namespace tessel::parallel {

struct RingAttentionOptions {
  bool causal = false;
  // Softmax scale; default 1 / sqrt(D).
  std::optional<double> scale;
  // Force a kernel backend (else the dispatcher's choice for each block).
  std::optional<kernels::SdpaBackend> backend;
};

// What one rank's forward computed, counted in (query segment, key segment) blocks.
struct RingAttentionStats {
  int64_t blocks_computed = 0;  // blocks the kernel ran on (full + diagonal)
  int64_t blocks_masked = 0;    // of those, blocks run with the causal mask (the diagonal)
  int64_t blocks_skipped = 0;   // blocks the causal mask hides entirely
  int64_t scores = 0;           // visible (query, key) pairs, summed over heads and batch
};

struct RingAttentionOutput {
  Tensor output;     // (B, H_q, S_local, D) f32, this rank's queries
  Tensor logsumexp;  // (B, H_q, S_local) f32, natural log, over the whole sequence
  RingAttentionStats stats;
};

// Attention of this rank's queries over the whole sequence's keys. q (B, H_q, S_local, D),
// k and v (B, H_kv, S_local, D) with H_q a multiple of H_kv, contiguous or not, f32 on the CPU;
// S_local == layout.local_len(rank) and layout.cp() == group.size(). Every rank of the group
// must call it (and, when a gradient is needed, run backward) in the same order; blocking.
// Records an autograd node when q, k or v requires a gradient; backward communicates over the
// same group. Throws InvalidArgument for mismatched shapes, dtypes or layout, and the group's
// errors when a peer fails.
RingAttentionOutput ring_attention(ProcessGroup& group, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const CpLayout& layout,
                                   const RingAttentionOptions& options = {});

}  // namespace tessel::parallel
