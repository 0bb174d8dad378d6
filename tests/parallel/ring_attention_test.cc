// Ring attention over a cp group on the threads backend: forward outputs and gradients (dQ, dK,
// dV) equal one process's scaled_dot_product_attention for cp = 2, 3, 4, causal and not,
// contiguous and load-balanced sharding (even and uneven lengths, GQA); the load-balanced split
// gives every rank the same causal work and the contiguous split does not; the sharding
// helpers invert each other.

#include "tessel/parallel/cp/ring_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/parallel/cp/sequence_shard.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel {
namespace {

// f32 tolerance: outputs and gradients agree to 1e-4 absolute (values are O(1)); the ring
// changes only the order of the softmax sums.
constexpr float kTol = 1e-4f;

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector<float>(contiguous(a));
  const std::vector<float> y = to_vector<float>(contiguous(b));
  EXPECT_EQ(x.size(), y.size());
  float m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

enum class Split { kContiguous, kLoadBalanced };

struct Case {
  int cp;
  bool causal;
  Split split;
  int64_t seq;
};

std::string case_name(const Case& c) {
  return "cp=" + std::to_string(c.cp) + (c.causal ? " causal" : " full") +
         (c.split == Split::kContiguous ? " contiguous" : " load-balanced") +
         " S=" + std::to_string(c.seq);
}

void check_case(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 16, S = c.seq;
  Generator gen(1234);
  Tensor q = randn({B, Hq, S, D}, gen), k = randn({B, Hkv, S, D}, gen);
  Tensor v = randn({B, Hkv, S, D}, gen), w = randn({B, Hq, S, D}, gen);
  // One process: attention over the whole sequence, loss = sum(out * w).
  Tensor q1 = clone(q), k1 = clone(k), v1 = clone(v);
  q1.set_requires_grad(true);
  k1.set_requires_grad(true);
  v1.set_requires_grad(true);
  kernels::SdpaOptions so;
  so.causal = c.causal;
  Tensor ref = kernels::scaled_dot_product_attention(q1, k1, v1, so);
  backward(sum(mul(ref, w)));

  const CpLayout layout = c.split == Split::kContiguous ? cp_layout_contiguous(S, c.cp)
                                                        : cp_layout_load_balanced(S, c.cp);
  std::vector<float> err_out(c.cp), err_dq(c.cp), err_dk(c.cp), err_dv(c.cp);
  threads::run_ranks(c.cp, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    // Leaf copies of this rank's slices (the shard of a one-segment layout may alias q).
    Tensor ql = clone(cp_shard_sequence(q, layout, r, 2));
    Tensor kl = clone(cp_shard_sequence(k, layout, r, 2));
    Tensor vl = clone(cp_shard_sequence(v, layout, r, 2));
    Tensor wl = cp_shard_sequence(w, layout, r, 2);
    ql.set_requires_grad(true);
    kl.set_requires_grad(true);
    vl.set_requires_grad(true);
    RingAttentionOutput out = ring_attention(pg, ql, kl, vl, layout, {.causal = c.causal});
    backward(sum(mul(out.output, wl)));
    err_out[r] = max_abs_diff(out.output, cp_shard_sequence(ref, layout, r, 2));
    err_dq[r] = max_abs_diff(ql.grad(), cp_shard_sequence(q1.grad(), layout, r, 2));
    err_dk[r] = max_abs_diff(kl.grad(), cp_shard_sequence(k1.grad(), layout, r, 2));
    err_dv[r] = max_abs_diff(vl.grad(), cp_shard_sequence(v1.grad(), layout, r, 2));
  });
  for (int r = 0; r < c.cp; ++r) {
    EXPECT_LE(err_out[r], kTol) << "rank " << r << " output";
    EXPECT_LE(err_dq[r], kTol) << "rank " << r << " dq";
    EXPECT_LE(err_dk[r], kTol) << "rank " << r << " dk";
    EXPECT_LE(err_dv[r], kTol) << "rank " << r << " dv";
  }
}

TEST(RingAttention, MatchesOneProcess) {
  for (int cp : {2, 3, 4}) {
    for (bool causal : {true, false}) {
      for (Split split : {Split::kContiguous, Split::kLoadBalanced}) {
        check_case({cp, causal, split, 24});
      }
    }
  }
}

TEST(RingAttention, MatchesOneProcessUnevenLengths) {
  // 26 tokens: cp = 3 contiguous gives 9/9/8, load-balanced 6 chunks of 5/5/4/4/4/4.
  for (Split split : {Split::kContiguous, Split::kLoadBalanced}) {
    check_case({3, true, split, 26});
    check_case({4, false, split, 26});
  }
}

TEST(RingAttention, SizeOneGroupIsPlainAttention) { check_case({1, true, Split::kContiguous, 8}); }

// Busiest vs idlest rank's computed blocks: (max - min) / max.
double block_spread(Split split, int cp, std::vector<RingAttentionStats>* stats) {
  const int64_t S = 48;  // 2·cp equal chunks for cp = 2, 3, 4
  const CpLayout layout =
      split == Split::kContiguous ? cp_layout_contiguous(S, cp) : cp_layout_load_balanced(S, cp);
  stats->assign(cp, {});
  threads::run_ranks(cp, [&](ProcessGroup& pg) {
    const int64_t n = layout.local_len(pg.rank());
    Tensor x = randn({1, 2, n, 8});
    (*stats)[pg.rank()] = ring_attention(pg, x, x, x, layout, {.causal = true}).stats;
  });
  int64_t lo = (*stats)[0].blocks_computed, hi = lo;
  for (const RingAttentionStats& s : *stats) {
    lo = std::min(lo, s.blocks_computed);
    hi = std::max(hi, s.blocks_computed);
  }
  return static_cast<double>(hi - lo) / static_cast<double>(hi);
}

TEST(RingAttention, LoadBalancedCausalSpreadsWorkEvenly) {
  for (int cp : {2, 3, 4}) {
    SCOPED_TRACE("cp=" + std::to_string(cp));
    std::vector<RingAttentionStats> stats;
    EXPECT_LE(block_spread(Split::kLoadBalanced, cp, &stats), 0.10);
    for (const RingAttentionStats& s : stats) {
      EXPECT_EQ(s.blocks_computed, 2 * cp + 1);  // 2cp - 1 full blocks and 2 diagonal ones
      EXPECT_EQ(s.blocks_masked, 2);
      EXPECT_EQ(s.scores, stats[0].scores);  // equal chunks: the same visible pairs too
    }
    EXPECT_GT(block_spread(Split::kContiguous, cp, &stats), 0.10);
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(stats[r].blocks_computed, r + 1);  // rank r sees r full blocks and its diagonal
      EXPECT_EQ(stats[r].blocks_skipped, cp - 1 - r);
    }
  }
}

TEST(SequenceShard, ShardAndUnshardInvert) {
  for (int cp : {1, 2, 3, 4}) {
    for (int64_t S : {int64_t{16}, int64_t{23}}) {
      for (const CpLayout& layout : {cp_layout_contiguous(S, cp), cp_layout_load_balanced(S, cp)}) {
        Tensor tokens = reshape(arange(2 * S), {2, S});
        std::vector<Tensor> pieces;
        std::vector<int64_t> seen;
        for (int r = 0; r < cp; ++r) {
          pieces.push_back(cp_shard_sequence(tokens, layout, r, 1));
          // Positions of the slice are the tokens of row 0 (tokens[0][s] == s).
          EXPECT_EQ(to_vector<int64_t>(cp_global_positions(layout, r)),
                    to_vector<int64_t>(contiguous(select(pieces.back(), 0, 0))));
          for (int64_t p : to_vector<int64_t>(cp_global_positions(layout, r))) seen.push_back(p);
        }
        EXPECT_EQ(to_vector<int64_t>(cp_unshard_sequence(pieces, layout, 1)),
                  to_vector<int64_t>(tokens));
        std::sort(seen.begin(), seen.end());
        ASSERT_EQ(static_cast<int64_t>(seen.size()), S);
        for (int64_t i = 0; i < S; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
      }
    }
  }
  const CpLayout lb = cp_layout_load_balanced(16, 2);  // chunks of 4: rank 0 {0, 3}, rank 1 {1, 2}
  EXPECT_EQ(to_vector<int64_t>(cp_global_positions(lb, 0)),
            (std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_THROW(cp_layout_load_balanced(3, 2), InvalidArgument);
}

}  // namespace
}  // namespace tessel::parallel
