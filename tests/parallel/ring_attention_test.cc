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

// Tolerances against one process's attention on the whole sequence. f32: 1e-4 absolute (values
// are O(1)); the ring changes only the order of the softmax sums. bf16, against one process's
// f32 result: within three times the error of one process's own bf16 attention (at least 1e-2) and
// never over 5e-2 (inputs rounded to bf16's 8-bit mantissa; the ring merges partial outputs in
// f32 but rounds each block's output and gradients to bf16, so dK/dV, summed over cp
// blocks, carry more roundings than one process's).
constexpr float kTolF32 = 1e-4f;
constexpr float kTolBf16Floor = 1e-2f;
constexpr float kTolBf16Max = 5e-2f;

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector<float>(contiguous(to(a, DType::kF32)));
  const std::vector<float> y = to_vector<float>(contiguous(to(b, DType::kF32)));
  EXPECT_EQ(x.size(), y.size());
  float m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

enum class Split { kContiguous, kLoadBalanced };
enum class Docs { kNone, kShared, kPerBatch };

struct Case {
  int cp;
  bool causal;
  Split split;
  int64_t seq;
  int64_t window_left = -1;
  int64_t window_right = -1;
  Docs docs = Docs::kNone;
  DType dtype = DType::kF32;
  CpAttentionAlgorithm algorithm = CpAttentionAlgorithm::kRing;
};

std::string case_name(const Case& c) {
  const char* docs[] = {"", " docs", " docs per batch"};
  return "cp=" + std::to_string(c.cp) + (c.causal ? " causal" : " full") +
         (c.split == Split::kContiguous ? " contiguous" : " load-balanced") +
         " S=" + std::to_string(c.seq) + " window=(" + std::to_string(c.window_left) + "," +
         std::to_string(c.window_right) + ")" + docs[static_cast<int>(c.docs)] + " " +
         std::string(dtype_name(c.dtype)) +
         (c.algorithm == CpAttentionAlgorithm::kAllGather ? " all-gather" : " ring");
}

// Packed-sequence document ids (B, S): documents of 1 to 9 tokens, different per batch row.
Tensor packed_documents(int64_t B, int64_t S) {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    int64_t doc = 0, left = 3 + b;
    for (int64_t s = 0; s < S; ++s) {
      if (left-- == 0) {
        ++doc;
        left = (doc * 5 + b) % 9;
      }
      ids.push_back(doc);
    }
  }
  return from_vector<int64_t>(ids, {B, S});
}

void check_case(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 16, S = c.seq;
  Generator gen(1234);
  Tensor q = randn({B, Hq, S, D}, gen), k = randn({B, Hkv, S, D}, gen);
  Tensor v = randn({B, Hkv, S, D}, gen), w = randn({B, Hq, S, D}, gen);
  Tensor docs;
  if (c.docs == Docs::kShared) docs = select(packed_documents(1, S), 0, 0);
  if (c.docs == Docs::kPerBatch) docs = packed_documents(B, S);
  // One process, f32: attention over the whole sequence, loss = sum(out * w).
  Tensor q1 = clone(q), k1 = clone(k), v1 = clone(v);
  q1.set_requires_grad(true);
  k1.set_requires_grad(true);
  v1.set_requires_grad(true);
  kernels::SdpaOptions so;
  so.causal = c.causal;
  so.window_left = c.window_left;
  so.window_right = c.window_right;
  so.document_ids = docs;
  Tensor ref = kernels::scaled_dot_product_attention(q1, k1, v1, so);
  backward(sum(mul(ref, w)));

  const CpLayout layout = c.split == Split::kContiguous ? cp_layout_contiguous(S, c.cp)
                                                        : cp_layout_load_balanced(S, c.cp);
  const int64_t seq_dim = docs.defined() ? docs.dim() - 1 : 0;
  std::vector<float> err_out(c.cp), err_dq(c.cp), err_dk(c.cp), err_dv(c.cp);
  threads::run_ranks(c.cp, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    // Leaf copies of this rank's slices (the shard of a one-segment layout may alias q).
    Tensor ql = to(cp_shard_sequence(q, layout, r, 2), c.dtype);
    Tensor kl = to(cp_shard_sequence(k, layout, r, 2), c.dtype);
    Tensor vl = to(cp_shard_sequence(v, layout, r, 2), c.dtype);
    ql = clone(ql), kl = clone(kl), vl = clone(vl);
    Tensor wl = cp_shard_sequence(w, layout, r, 2);
    ql.set_requires_grad(true);
    kl.set_requires_grad(true);
    vl.set_requires_grad(true);
    RingAttentionOptions o{.causal = c.causal,
                           .window_left = c.window_left,
                           .window_right = c.window_right,
                           .algorithm = c.algorithm};
    if (docs.defined()) o.document_ids = cp_shard_sequence(docs, layout, r, seq_dim);
    RingAttentionOutput out = ring_attention(pg, ql, kl, vl, layout, o);
    EXPECT_EQ(out.output.dtype(), c.dtype);
    backward(sum(mul(to(out.output, DType::kF32), wl)));
    err_out[r] = max_abs_diff(out.output, cp_shard_sequence(ref, layout, r, 2));
    err_dq[r] = max_abs_diff(ql.grad(), cp_shard_sequence(q1.grad(), layout, r, 2));
    err_dk[r] = max_abs_diff(kl.grad(), cp_shard_sequence(k1.grad(), layout, r, 2));
    err_dv[r] = max_abs_diff(vl.grad(), cp_shard_sequence(v1.grad(), layout, r, 2));
  });
  // Tolerances: f32 fixed; bf16 from one process's own bf16 error on the same problem.
  float tol[4] = {kTolF32, kTolF32, kTolF32, kTolF32};
  if (c.dtype == DType::kBF16) {
    Tensor q2 = to(q, c.dtype), k2 = to(k, c.dtype), v2 = to(v, c.dtype);
    q2.set_requires_grad(true);
    k2.set_requires_grad(true);
    v2.set_requires_grad(true);
    Tensor one = kernels::scaled_dot_product_attention(q2, k2, v2, so);
    backward(sum(mul(to(one, DType::kF32), w)));
    const float own[4] = {max_abs_diff(one, ref), max_abs_diff(q2.grad(), q1.grad()),
                          max_abs_diff(k2.grad(), k1.grad()), max_abs_diff(v2.grad(), v1.grad())};
    for (int i = 0; i < 4; ++i) tol[i] = std::min(std::max(3 * own[i], kTolBf16Floor), kTolBf16Max);
  }
  for (int r = 0; r < c.cp; ++r) {
    EXPECT_LE(err_out[r], tol[0]) << "rank " << r << " output";
    EXPECT_LE(err_dq[r], tol[1]) << "rank " << r << " dq";
    EXPECT_LE(err_dk[r], tol[2]) << "rank " << r << " dk";
    EXPECT_LE(err_dv[r], tol[3]) << "rank " << r << " dv";
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

// Sliding windows and document ids across ranks, cp = 2, 3, 4 on uneven lengths (29 tokens).
TEST(RingAttention, MasksAcrossRanksMatchOneProcess) {
  for (int cp : {2, 3, 4}) {
    for (Split split : {Split::kContiguous, Split::kLoadBalanced}) {
      check_case({cp, true, split, 29, /*window_left=*/6});  // causal local
      check_case({cp, false, split, 29, /*window_left=*/3, /*window_right=*/8});
      check_case({cp, true, split, 29, -1, -1, Docs::kShared});  // packed documents
      check_case({cp, false, split, 29, 5, 2, Docs::kPerBatch});
    }
  }
}

TEST(RingAttention, Bf16MatchesOneProcessWithinBf16Tolerance) {
  for (int cp : {2, 3, 4}) {
    check_case({cp, true, Split::kLoadBalanced, 29, -1, -1, Docs::kNone, DType::kBF16});
    check_case({cp, true, Split::kLoadBalanced, 29, 7, -1, Docs::kShared, DType::kBF16});
  }
}

TEST(RingAttention, AllGatherVariantMatchesOneProcess) {
  for (int cp : {2, 3, 4}) {
    check_case({cp, true, Split::kLoadBalanced, 29, -1, -1, Docs::kNone, DType::kF32,
                CpAttentionAlgorithm::kAllGather});
    check_case({cp, false, Split::kContiguous, 26, 4, 3, Docs::kPerBatch, DType::kF32,
                CpAttentionAlgorithm::kAllGather});
  }
  check_case({2, true, Split::kLoadBalanced, 29, 7, -1, Docs::kShared, DType::kBF16,
              CpAttentionAlgorithm::kAllGather});
}

TEST(RingAttention, SizeOneGroupIsPlainAttention) {
  check_case({1, true, Split::kContiguous, 8});
  check_case({1, false, Split::kContiguous, 8, 2, 1, Docs::kShared});
}

// Blocks a mask hides entirely are skipped without compute; blocks it does not touch run
// without a mask. Contiguous split of 24 tokens over cp = 4 (6 per rank).
TEST(RingAttention, BlocksHiddenByMasksAreSkipped) {
  const int cp = 4;
  const CpLayout layout = cp_layout_contiguous(24, cp);
  auto run = [&](RingAttentionOptions o, bool per_rank_docs) {
    std::vector<RingAttentionStats> stats(cp);
    threads::run_ranks(cp, [&](ProcessGroup& pg) {
      Tensor x = randn({1, 2, 6, 8});
      RingAttentionOptions mine = o;
      // One document per rank: every block but the rank's own is hidden.
      if (per_rank_docs) mine.document_ids = full({6}, pg.rank(), DType::kI64);
      stats[pg.rank()] = ring_attention(pg, x, x, x, layout, mine).stats;
    });
    return stats;
  };
  for (const RingAttentionStats& s : run({}, true)) {
    EXPECT_EQ(s.blocks_computed, 1);
    EXPECT_EQ(s.blocks_skipped, 3);
    EXPECT_EQ(s.blocks_masked, 1);  // the documents are a mask (the kernel does not know ids)
  }
  // Causal window of 5 keys: rank r sees its diagonal and the end of rank r - 1's tokens; the
  // blocks of r - 2 and before are hidden, as are all later ones (causal).
  const std::vector<RingAttentionStats> w = run({.causal = true, .window_left = 5}, false);
  for (int r = 0; r < cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(w[r].blocks_computed, r == 0 ? 1 : 2);
    EXPECT_EQ(w[r].blocks_skipped, r == 0 ? 3 : 2);
    EXPECT_EQ(w[r].blocks_masked, w[r].blocks_computed);
    // Visible pairs: query i sees min(i, 5) + 1 keys, 6 queries per rank, 2 heads.
    int64_t pairs = 0;
    for (int64_t i = 6 * r; i < 6 * r + 6; ++i) pairs += std::min<int64_t>(i, 5) + 1;
    EXPECT_EQ(w[r].scores, 2 * pairs);
  }
}

TEST(RingAttention, BadInputIsRejectedBeforeCommunicating) {
  const CpLayout layout = cp_layout_contiguous(8, 2);
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    Tensor x = randn({1, 2, 4, 8});
    EXPECT_THROW(ring_attention(pg, x, x, x, layout, {.window_left = -2}), InvalidArgument);
    RingAttentionOptions o;
    o.document_ids = zeros({5}, DType::kI64);  // 4 tokens on this rank
    EXPECT_THROW(ring_attention(pg, x, x, x, layout, o), InvalidArgument);
    o.document_ids = zeros({4}, DType::kF32);
    EXPECT_THROW(ring_attention(pg, x, x, x, layout, o), InvalidArgument);
    EXPECT_THROW(ring_attention(pg, x, to(x, DType::kBF16), x, layout), InvalidArgument);
  });
}

// The automatic choice: all-gather when cp * H_kv <= H_q.
TEST(RingAttention, AutoPicksAllGatherForShortRingsAndGqa) {
  const CpLayout layout = cp_layout_contiguous(8, 2);
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    Tensor q = randn({1, 4, 4, 8}), kv_gqa = randn({1, 2, 4, 8}), kv_mha = randn({1, 4, 4, 8});
    EXPECT_EQ(ring_attention(pg, q, kv_gqa, kv_gqa, layout).stats.algorithm,
              CpAttentionAlgorithm::kAllGather);
    EXPECT_EQ(ring_attention(pg, q, kv_mha, kv_mha, layout).stats.algorithm,
              CpAttentionAlgorithm::kRing);
  });
}

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
