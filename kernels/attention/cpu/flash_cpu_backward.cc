// flash_cpu backward (FlashAttention-2, Algorithm 2): per key block, loop over the query blocks
// of every query head in the key/value head's group; recompute P = exp(S - lse), then
//   dV += P_drop^T dO,  dP = (dO V^T) * keep,  dS = P * (dP - rowsum(dO * O)),
//   dK += scale dS^T Q,  dQ += scale dS K (into a shared accumulator under a per-block lock).

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/flash_common.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::kernels::attention {

using namespace internal;

namespace {

// One worker's tiles. kt/vt: this key block transposed (dp x bk); k: its rows (bk x dp).
struct BackwardScratch {
  TileVector<float> kt, vt, k, q, dout, p, pdrop, ds, dk, dv, keep, row;
  // bf16 path, in pairs of bf16: K^T and V^T paired along D (dp/2 x bk), K paired along keys
  // (bk/2 x dp); per tile Q and dO paired along D (rows x dp/2) and along queries
  // (rows/2 x dp), P_drop^T and dS^T paired along queries (rows/2 x bk), dS along keys.
  TileVector<uint32_t> kt2, vt2, k2, q_d, dout_d, q_i, dout_i, pt2, dst2, ds2;
  BackwardScratch(const FlashPlan& plan, bool bf16)
      : kt(plan.dp * plan.bk),
        vt(plan.dp * plan.bk),
        k(plan.bk * plan.dp),
        q(plan.bq * plan.dp),
        dout(plan.bq * plan.dp),
        p(plan.bq * plan.bk),
        pdrop(plan.bq * plan.bk),
        ds(plan.bq * plan.bk),
        dk(plan.bk * plan.dp),
        dv(plan.bk * plan.dp),
        keep(plan.bq * plan.bk),
        row(std::max(plan.bk, plan.bq) * plan.dp) {
    if (!bf16) return;
    const int64_t half_q = (plan.bq + 1) / 2;
    for (auto* v : {&kt2, &vt2, &k2}) v->resize(plan.dp * plan.bk / 2);
    for (auto* v : {&q_d, &dout_d}) v->resize(plan.bq * plan.dp / 2);
    for (auto* v : {&q_i, &dout_i}) v->resize(half_q * plan.dp);
    for (auto* v : {&pt2, &dst2}) v->resize(half_q * plan.bk);
    ds2.resize(plan.bq * plan.bk / 2);
  }
};

// dst row t (n pairs, stride ld_dst) = rows 2t and 2t+1 of src (stride ld_src) interleaved,
// for t < ceil(rows / 2); a missing last row pairs with 0.
void pair_rows(const Bf16TileOps& ops, const float* src, int64_t ld_src, int64_t rows, int64_t n,
               uint32_t* dst, int64_t ld_dst) {
  for (int64_t t = 0; 2 * t < rows; ++t) {
    ops.to_bf16_pairs(src + 2 * t * ld_src, 2 * t + 1 < rows ? src + (2 * t + 1) * ld_src : nullptr,
                      dst + t * ld_dst, n);
  }
}

// Rows [s0, s0 + rows) of (b, h) as an f32 operand with leading dimension *ld: the view's own
// memory when it already is f32 with unit stride and D == dp, else a padded copy in buf.
const float* tile_rows(const AttentionView& view, int64_t b, int64_t h, int64_t s0, int64_t rows,
                       int64_t dp, float* buf, int64_t* ld) {
  if (view.dtype == DType::kF32 && view.strides[3] == 1 && view.head_dim() == dp) {
    *ld = view.strides[2];
    return static_cast<const float*>(view.data) + view.offset(b, h, s0, 0);
  }
  load_rows(view, b, h, s0, rows, rows, buf, dp);
  *ld = dp;
  return buf;
}

}  // namespace

void flash_cpu_backward(const AttentionProblem& p, const AttentionView& out,
                        const AttentionView& dout, const float* lse, const AttentionView& dq,
                        const AttentionView& dk, const AttentionView& dv,
                        const FlashCpuOptions& options) {
  const FlashPlan plan = make_flash_plan(p, options);
  validate_attention_output(out, p.q, "out");
  validate_attention_output(dout, p.q, "dout");
  validate_attention_output(dq, p.q, "dq");
  validate_attention_output(dk, p.k, "dk");
  validate_attention_output(dv, p.v, "dv");
  TESSEL_CHECK(lse != nullptr || plan.sq * plan.q_heads * plan.batch == 0, InvalidArgument,
               "flash_cpu_backward: lse is null; pass forward's logsumexp");
  if (plan.amx) {
    flash_cpu_backward_amx(p, plan, out, dout, lse, dq, dk, dv);
    return;
  }
  const ForkJoin team(plan.threads);
  const MaskEvaluator mask(p);
  const DropoutMask drop(p.dropout.p, p.dropout.seed, p.dropout.offset);
  const TileOps& ops = *plan.ops;
  const int64_t bq = plan.bq, bk = plan.bk, dp = plan.dp;
  const float s_mul = plan.scale * kLog2e;  // scores to log2 units

  const std::vector<float> delta = output_dot(out, dout, plan, team);
  const Workspace<float> dq_acc(plan.batch * plan.q_heads * plan.q_blocks * bq * dp, 0.0f);
  const auto dq_locks = std::make_unique<std::mutex[]>(plan.batch * plan.q_heads * plan.q_blocks);
  const Bf16TileOps* bf16 = plan.bf16;  // null: f32 GEMMs
  std::vector<BackwardScratch> scratch(team.threads(), BackwardScratch(plan, bf16 != nullptr));
  const bool full_mask = mask.is_dense() && p.mask.prefix_lengths.empty();

  team.run(plan.batch * plan.kv_heads * plan.kv_blocks, [&](int worker, int64_t task) {
    const int64_t kb = task % plan.kv_blocks, bhk = task / plan.kv_blocks;
    const int64_t b = bhk / plan.kv_heads, hk = bhk % plan.kv_heads;
    const int64_t j0 = kb * bk, cols = std::min(bk, plan.sk - j0);
    BackwardScratch& w = scratch[worker];
    load_rows_transposed(p.k, b, hk, j0, cols, bk, dp, w.kt.data(), w.row.data());
    load_rows_transposed(p.v, b, hk, j0, cols, bk, dp, w.vt.data(), w.row.data());
    load_rows(p.k, b, hk, j0, cols, bk, w.k.data(), dp);
    if (bf16) {
      pair_rows(*bf16, w.kt.data(), bk, dp, bk, w.kt2.data(), bk);
      pair_rows(*bf16, w.vt.data(), bk, dp, bk, w.vt2.data(), bk);
      pair_rows(*bf16, w.k.data(), dp, bk, dp, w.k2.data(), dp);
    }
    std::fill(w.dk.begin(), w.dk.end(), 0.0f);
    std::fill(w.dv.begin(), w.dv.end(), 0.0f);

    for_each_backward_tile(plan, mask, full_mask, b, hk, kb, [&](const BackwardTile& bt) {
      const int64_t h = bt.h, i0 = bt.i0, rows = bt.rows;
      const int64_t bh = b * plan.q_heads + h, ib = i0 / bq;
      int64_t ldq, ldo;
      const float* q = tile_rows(p.q, b, h, i0, rows, dp, w.q.data(), &ldq);
      const float* g = tile_rows(dout, b, h, i0, rows, dp, w.dout.data(), &ldo);
      const int64_t rows2 = (rows + 1) / 2;
      if (bf16) {
        for (int64_t r = 0; r < rows; ++r) {
          bf16->to_bf16(q + r * ldq, reinterpret_cast<uint16_t*>(w.q_d.data()) + r * dp, dp);
          bf16->to_bf16(g + r * ldo, reinterpret_cast<uint16_t*>(w.dout_d.data()) + r * dp, dp);
        }
        pair_rows(*bf16, q, ldq, rows, dp, w.q_i.data(), dp);
        pair_rows(*bf16, g, ldo, rows, dp, w.dout_i.data(), dp);
      }

      // P = exp(scale * Q K^T - lse), masked; P_drop = P * keep.
      if (bf16) {
        bf16->gemm(rows, bk, dp / 2, w.q_d.data(), dp / 2, 1, w.kt2.data(), bk, w.p.data(), bk,
                   false);
      } else {
        ops.gemm(rows, bk, dp, q, ldq, 1, w.kt.data(), bk, w.p.data(), bk, false);
      }
      const float* pdrop =
          backward_probabilities(ops, mask, drop, bt, lse + bh * plan.sq + i0, s_mul, bk,
                                 w.p.data(), w.keep.data(), w.pdrop.data());
      // dV += P_drop^T dO (A read transposed in place); dP = dO V^T.
      if (bf16) {
        pair_rows(*bf16, pdrop, bk, rows, bk, w.pt2.data(), bk);
        bf16->gemm(cols, dp, rows2, w.pt2.data(), 1, bk, w.dout_i.data(), dp, w.dv.data(), dp,
                   true);
        bf16->gemm(rows, bk, dp / 2, w.dout_d.data(), dp / 2, 1, w.vt2.data(), bk, w.ds.data(), bk,
                   false);
      } else {
        ops.gemm(cols, dp, rows, pdrop, 1, bk, g, ldo, w.dv.data(), dp, true);
        ops.gemm(rows, bk, dp, g, ldo, 1, w.vt.data(), bk, w.ds.data(), bk, false);
      }
      // Through dropout; dS = P * (dP - delta).
      ops.ds_rows(w.p.data(), drop.enabled() ? w.keep.data() : nullptr,
                  delta.data() + bh * plan.sq + i0, rows, bk, w.ds.data());
      // dK += dS^T Q; dQ += dS K straight into the shared accumulator (scale applied when
      // storing).
      const int64_t block = bh * plan.q_blocks + ib;
      float* dq_block = dq_acc.data() + block * bq * dp;
      if (bf16) {
        pair_rows(*bf16, w.ds.data(), bk, rows, bk, w.dst2.data(), bk);
        bf16->gemm(cols, dp, rows2, w.dst2.data(), 1, bk, w.q_i.data(), dp, w.dk.data(), dp, true);
        bf16->to_bf16(w.ds.data(), reinterpret_cast<uint16_t*>(w.ds2.data()), rows * bk);
        std::lock_guard<std::mutex> lock(dq_locks[block]);
        bf16->gemm(rows, dp, bk / 2, w.ds2.data(), bk / 2, 1, w.k2.data(), dp, dq_block, dp, true);
      } else {
        ops.gemm(cols, dp, rows, w.ds.data(), 1, bk, q, ldq, w.dk.data(), dp, true);
        std::lock_guard<std::mutex> lock(dq_locks[block]);
        ops.gemm(rows, dp, cols, w.ds.data(), bk, 1, w.k.data(), dp, dq_block, dp, true);
      }
    });
    for (int64_t c = 0; c < cols; ++c) {
      store_row(dk, b, hk, j0 + c, w.dk.data() + c * dp, plan.scale);
      store_row(dv, b, hk, j0 + c, w.dv.data() + c * dp);
    }
  });

  store_dq(dq, plan, dq_acc.data(), team, /*column_blocks=*/false);
}

}  // namespace tessel::kernels::attention
