#pragma once
// Context-parallel attention over a `cp` group: each rank holds a slice of every sequence (a
// CpLayout) and computes the attention of its queries over the whole sequence's keys with the
// fused attention kernel, block by block, merging partial outputs with their log-sum-exps.
// Differentiable. Two schedules: the ring (K/V blocks travel around the group while each rank
// attends to the block in hand) and the all-gather of K/V (one collective, then local blocks).
//
//   CpLayout layout = cp_layout_load_balanced(S, cp_group.size());
//   Tensor q_local = cp_shard_sequence(q, layout, cp_group.rank(), /*dim=*/2);   // same k, v
//   RingAttentionOutput r = ring_attention(cp_group, q_local, k_local, v_local, layout,
//                                          {.causal = true});
//   backward(loss_of(r.output));   // dq, dk, dv of this rank's slices
//
// Ring schedule (cp = n, rank r): at step s = 0..n-1 the rank holds the K/V block of rank r - s;
// before it attends to it, it sends the block to r + 1 and receives the next from r - 1
// (asynchronous ops, so the transfer runs on the group's worker while the kernel runs here).
// Every (query segment, key segment) pair is planned from global positions: the masks (causal,
// sliding window, documents) give the rows and keys of the block that can see each other; a
// block they hide entirely is skipped without compute, a block they do not touch runs without
// a mask. Backward re-runs the ring: K/V travel ahead as in forward, and the dK/dV accumulator
// of each block follows one step behind (sent while the next block is computed); after the last
// step the accumulators go one hop further, home to their owners (the one transfer not hidden).
//
// All-gather schedule: every rank gathers all K/V once (cp x its K/V in memory, saved for
// backward), computes its blocks, and backward reduce-scatters dK/dV. Nothing overlaps, but
// there is one collective instead of cp - 1 exchanges: the better choice for short rings and
// grouped-query attention, whose K/V are small beside Q.

#include <cstdint>
#include <memory>
#include <optional>

#include "tessel/base/clock.h"
#include "tessel/collectives/process_group.h"
#include "tessel/kernels/attention/sdpa_backend.h"
#include "tessel/parallel/cp/sequence_shard.h"
#include "tessel/tensor/tensor.h"

namespace tessel::parallel {

// How K/V reach every rank.
enum class CpAttentionAlgorithm : uint8_t {
  // All-gather when cp * H_kv <= H_q (the gathered K/V is no larger than the local Q: short
  // rings and grouped-query attention), else the ring.
  kAuto,
  kRing,
  kAllGather,
};

struct RingAttentionOptions {
  // Masks, in global positions (as scaled_dot_product_attention's on the whole sequence).
  bool causal = false;
  // Sliding window in keys before/after the query's position; -1 unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Document ids of this rank's tokens (packed sequences: a query sees keys of its own document
  // only): integer, (S_local) shared by the batch or (B, S_local), in the rank's local order
  // (cp_shard_sequence of the global ids). Undefined: no documents. Gathered from every rank
  // once per call (one small all_gather).
  Tensor document_ids;
  // Softmax scale; default 1 / sqrt(D).
  std::optional<double> scale;
  // Force a kernel backend (else the dispatcher's choice for each block).
  std::optional<kernels::SdpaBackend> backend;
  CpAttentionAlgorithm algorithm = CpAttentionAlgorithm::kAuto;
};

// What one rank computed, counted in (query segment, key segment) blocks.
struct RingAttentionStats {
  CpAttentionAlgorithm algorithm = CpAttentionAlgorithm::kRing;  // the one that ran
  int64_t blocks_computed = 0;                                   // blocks the kernel ran on
  int64_t blocks_masked = 0;   // of those, blocks run with a mask (window or documents)
  int64_t blocks_skipped = 0;  // blocks the masks hide entirely (no compute)
  int64_t scores = 0;  // (query, key) pairs the causal/window masks leave, summed over B and H_q
  Nanoseconds exposed_wait{0};  // time blocked waiting for K/V (and dK/dV) transfers
};

struct RingAttentionOutput {
  Tensor output;             // (B, H_q, S_local, D) in q's dtype, this rank's queries
  Tensor logsumexp;          // (B, H_q, S_local) f32, natural log, over the whole sequence
  RingAttentionStats stats;  // forward
  // Backward's figures, filled when backward has run through this call.
  std::shared_ptr<const RingAttentionStats> backward_stats;
};

// Attention of this rank's queries over the whole sequence's keys. q (B, H_q, S_local, D),
// k and v (B, H_kv, S_local, D) with H_q a multiple of H_kv, contiguous or not, one dtype (f32
// or bf16; bf16 K/V travel as bf16, partial results merge in f32) on the CPU;
// S_local == layout.local_len(rank) and layout.cp() == group.size(). Every rank of the group
// must call it (and, when a gradient is needed, run backward) in the same order; blocking.
// Records an autograd node when q, k or v requires a gradient; backward communicates over the
// same group. Throws InvalidArgument for mismatched shapes, dtypes, layout, windows or document
// ids, and the group's errors when a peer fails.
RingAttentionOutput ring_attention(ProcessGroup& group, const Tensor& q, const Tensor& k,
                                   const Tensor& v, const CpLayout& layout,
                                   const RingAttentionOptions& options = {});

}  // namespace tessel::parallel
