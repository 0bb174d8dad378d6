#pragma once
// One (query segment, key segment) block of context-parallel attention: the part of it that the
// masks (causal, sliding window, documents; all in global positions) leave visible, and the
// kernel's forward and backward on that part, merged into f32 accumulators. Shared by the ring
// and the all-gather schedules (ring_attention.cc).

#include <cstdint>
#include <vector>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/sdpa_backend.h"
#include "tessel/parallel/cp/ring_attention.h"
#include "tessel/parallel/cp/sequence_shard.h"
#include "tessel/tensor/tensor.h"

namespace tessel::parallel::internal {

// The masks of one call in global positions. A plain value.
struct CpMask {
  bool causal = false;
  int64_t window_left = -1;  // keys before the query's position it may see; -1 unbounded
  int64_t window_right = -1;
  // Document ids in global order: doc_rows rows (1: shared by the batch, or B) of seq_len ids;
  // doc_rows == 0: no documents.
  int64_t doc_rows = 0;
  int64_t seq_len = 0;
  std::vector<int64_t> docs;

  // Keys after the query position it may see, with causal folded in; -1 unbounded.
  int64_t right() const { return causal ? 0 : window_right; }
};

// What the masks leave of one block: query rows [i0, i1) of the query segment see keys
// [j0, j1) of the key segment through the kernel's window (left, right) in the sub-block's own
// indices (top-left aligned), plus the documents when there are any; nothing else of the block
// is visible.
struct BlockPlan {
  bool skip = true;  // the masks hide the whole block
  int64_t i0 = 0, i1 = 0, j0 = 0, j1 = 0;
  int64_t window_left = -1, window_right = -1;
  bool masked = false;  // the kernel runs with a mask (window or documents)
  int64_t pairs = 0;    // (query, key) pairs the causal/window part leaves visible
};

BlockPlan plan_block(const CpMask& mask, const CpSegment& qs, const CpSegment& ks);

// The shapes of one call, named once.
struct Dims {
  int64_t B = 0, Hq = 0, Hkv = 0, D = 0;
};

// A (B, H, len, D) view of rows [start, start + len) of a contiguous (B, H, S, D) buffer that
// begins `element_offset` elements into `t` (t's dtype).
kernels::attention::AttentionView rows_view(const Tensor& t, int64_t element_offset, int64_t B,
                                            int64_t H, int64_t S, int64_t D, int64_t start,
                                            int64_t len);

// Everything a block's kernel call needs besides the data.
struct BlockContext {
  const CpMask* mask = nullptr;
  Dims dims;
  const RingAttentionOptions* options = nullptr;
};

// The (B, H, len, D) views of one block's query segment (q) and key segment (k, v), q's dtype.
struct BlockViews {
  kernels::attention::AttentionView q, k, v;
};

// Runs the block's forward on the plan's rows and merges its output and log-sum-exp into rows
// [q_off + plan.i0, q_off + plan.i1) of the f32 accumulators out (B, H_q, s_local, D) and
// lse (B, H_q, s_local): lse = log(e^lse + e^lse_blk), out weighted accordingly.
void block_forward(const BlockContext& c, const BlockPlan& plan, const CpSegment& qs,
                   const CpSegment& ks, const BlockViews& views, int64_t q_off, Tensor& out,
                   Tensor& lse);

// Runs the block's backward. out and dout are the merged output and its gradient (B, H_q,
// s_local, D) in q's dtype, lse the merged f32 (B, H_q, s_local). Adds dQ into rows of the f32
// dq (B, H_q, s_local, D) at q_off, and dK/dV into rows at k_off of the f32 planes dk, dv
// (B, H_kv, s_kv, D).
void block_backward(const BlockContext& c, const BlockPlan& plan, const CpSegment& qs,
                    const CpSegment& ks, const BlockViews& views, const Tensor& out,
                    const Tensor& dout, const Tensor& lse, int64_t q_off, Tensor& dq, float* dk,
                    float* dv, int64_t s_kv, int64_t k_off);

}  // namespace tessel::parallel::internal
