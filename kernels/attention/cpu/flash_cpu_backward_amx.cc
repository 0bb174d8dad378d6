// flash_cpu backward with every GEMM on AMX tiles (bf16 inputs): the algorithm of
// flash_cpu_backward.cc, per key block over the query blocks of every query head in its group:
//   S = Q K^T,  P = exp(scale S - lse) (masked),  dV^T += dO^T P_drop,  dP = dO V^T,
//   dS = P * (dP * keep - delta),  dK^T += Q^T dS,  dQ += dS K (shared, under a lock).
// A tile GEMM reads A as rows of pairs along the reduction and B as pairs of rows (see
// AmxTileOps), so dK and dV are accumulated transposed: their B operands are then pairs of
// consecutive rows of P and dS, which the softmax produces directly. Q and dO are laid out once
// per call in the two arrangements their GEMMs read (rows, and transposed pairs of rows); K and V
// once per task. The softmax and dS stay f32; P and dS are rounded to bf16 before their GEMMs.

#include <algorithm>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/flash_common.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::kernels::attention::internal {
namespace {

// Q or dO of one call laid out for the tiles, per (batch, head, query block of bq rows):
//   rows: [bq][dp / 2] pairs along D (the A operand of Q K^T and dO V^T);
//   cols: [dp][bq / 2] pairs of consecutive rows, transposed (the A operand of Q^T dS and
//         dO^T P). Padding rows and columns are zero.
struct QueryOperand {
  Workspace<uint32_t> rows, cols;
  int64_t block = 0;  // pairs per query block in each array
};

QueryOperand layout_queries(const AttentionView& view, const FlashPlan& plan,
                            const ForkJoin& team) {
  const int64_t bq = plan.bq, dp = plan.dp;
  QueryOperand op;
  op.block = bq * dp / 2;
  const int64_t blocks = plan.batch * plan.q_heads * plan.q_blocks;
  op.rows = Workspace<uint32_t>(blocks * op.block, 0u);
  op.cols = Workspace<uint32_t>(blocks * op.block, 0u);
  team.run(blocks, [&](int, int64_t blk) {
    const int64_t ib = blk % plan.q_blocks, bh = blk / plan.q_blocks;
    const int64_t b = bh / plan.q_heads, h = bh % plan.q_heads;
    const int64_t i0 = ib * bq, rows = std::min(bq, plan.sq - i0);
    uint16_t* x = reinterpret_cast<uint16_t*>(op.rows.data() + blk * op.block);
    for (int64_t r = 0; r < rows; ++r) load_row_bf16(view, b, h, i0 + r, x + r * dp, dp);
    uint32_t* t = op.cols.data() + blk * op.block;
    for (int64_t c = 0; c < dp; ++c) {
      for (int64_t u = 0; u < bq / 2; ++u) {
        t[c * (bq / 2) + u] = bf16_pair(x[2 * u * dp + c], x[(2 * u + 1) * dp + c]);
      }
    }
  });
  return op;
}

// One worker's tiles (bq x bk unless said otherwise). kt, vt: K^T and V^T of the key block as
// pairs along D ([dp / 2][bk], B of Q K^T and dO V^T); kp: K as pairs of consecutive keys
// ([bk / 2][dp], B of dS K); pp, dsp: pairs of consecutive rows of P_drop and dS
// ([bq / 2][bk]); dsb: dS rows in bf16 ([bq][bk / 2] pairs); dkt, dvt: dK^T and dV^T
// ([dp][bk] f32).
struct AmxScratch {
  TileVector<float> p, pdrop, ds, keep, dkt, dvt, row;
  TileVector<uint32_t> kt, vt, kp, pp, dsp, dsb;
  std::vector<uint16_t> kbits, vbits;
  explicit AmxScratch(const FlashPlan& plan)
      : p(plan.bq * plan.bk),
        pdrop(plan.bq * plan.bk),
        ds(plan.bq * plan.bk),
        keep(plan.bq * plan.bk),
        dkt(plan.dp * plan.bk),
        dvt(plan.dp * plan.bk),
        row(plan.bk * plan.dp),
        kt(plan.dp / 2 * plan.bk),
        vt(plan.dp / 2 * plan.bk),
        kp(plan.bk / 2 * plan.dp),
        pp(plan.bq / 2 * plan.bk),
        dsp(plan.bq / 2 * plan.bk),
        dsb(plan.bq * plan.bk / 2),
        kbits(plan.bk * plan.dp),
        vbits(plan.bk * plan.dp) {}
};

// x: rows [bk][dp] of bf16, read as [bk][dp / 2] pairs; xt = its transpose ([dp / 2][bk]).
void transpose_pairs(const uint16_t* x, int64_t bk, int64_t dp, uint32_t* xt) {
  const auto* pairs = reinterpret_cast<const uint32_t*>(x);
  for (int64_t j = 0; j < bk; ++j) {
    for (int64_t t = 0; t < dp / 2; ++t) xt[t * bk + j] = pairs[j * (dp / 2) + t];
  }
}

}  // namespace

void flash_cpu_backward_amx(const AttentionProblem& p, const FlashPlan& plan,
                            const AttentionView& out, const AttentionView& dout, const float* lse,
                            const AttentionView& dq, const AttentionView& dk,
                            const AttentionView& dv) {
  const ForkJoin team(plan.threads);
  const MaskEvaluator mask(p);
  const DropoutMask drop(p.dropout.p, p.dropout.seed, p.dropout.offset);
  const TileOps& ops = *plan.ops;
  const Bf16TileOps& bf16 = *plan.bf16;
  const AmxTileOps& amx = *plan.amx;
  const int64_t bq = plan.bq, bk = plan.bk, d = plan.d, dp = plan.dp;
  const float s_mul = plan.scale * kLog2e;  // scores to log2 units

  const std::vector<float> delta = output_dot(out, dout, plan, team);
  const QueryOperand q_op = layout_queries(p.q, plan, team);
  const QueryOperand do_op = layout_queries(dout, plan, team);
  const Workspace<float> dq_acc(plan.batch * plan.q_heads * plan.q_blocks * bq * dp, 0.0f);
  const auto dq_locks = std::make_unique<std::mutex[]>(plan.batch * plan.q_heads * plan.q_blocks);
  std::vector<AmxScratch> scratch(team.threads(), AmxScratch(plan));
  const bool full_mask = mask.is_dense() && p.mask.prefix_lengths.empty();

  team.run(plan.batch * plan.kv_heads * plan.kv_blocks, [&](int worker, int64_t task) {
    const int64_t kb = task % plan.kv_blocks, bhk = task / plan.kv_blocks;
    const int64_t b = bhk / plan.kv_heads, hk = bhk % plan.kv_heads;
    const int64_t j0 = kb * bk, cols = std::min(bk, plan.sk - j0);
    AmxScratch& w = scratch[worker];
    const AmxTileScope tiles(&amx);
    // The key block's K and V in the three arrangements, zero past the last key.
    std::fill(w.kbits.begin(), w.kbits.end(), uint16_t{0});
    std::fill(w.vbits.begin(), w.vbits.end(), uint16_t{0});
    for (int64_t j = 0; j < cols; ++j) {
      load_row_bf16(p.k, b, hk, j0 + j, w.kbits.data() + j * dp, dp);
      load_row_bf16(p.v, b, hk, j0 + j, w.vbits.data() + j * dp, dp);
    }
    transpose_pairs(w.kbits.data(), bk, dp, w.kt.data());
    transpose_pairs(w.vbits.data(), bk, dp, w.vt.data());
    for (int64_t t = 0; t < bk / 2; ++t) {
      for (int64_t c = 0; c < dp; ++c) {
        w.kp[c / 16 * (bk / 2 * 16) + t * 16 + c % 16] =
            bf16_pair(w.kbits[2 * t * dp + c], w.kbits[(2 * t + 1) * dp + c]);
      }
    }
    std::fill(w.dkt.begin(), w.dkt.end(), 0.0f);
    std::fill(w.dvt.begin(), w.dvt.end(), 0.0f);

    for_each_backward_tile(plan, mask, full_mask, b, hk, kb, [&](const BackwardTile& bt) {
      const int64_t h = bt.h, i0 = bt.i0, rows = bt.rows;
      const int64_t bh = b * plan.q_heads + h, ib = i0 / bq;
      const int64_t block = bh * plan.q_blocks + ib;
      const uint32_t* q_rows = q_op.rows.data() + block * q_op.block;
      const uint32_t* q_cols = q_op.cols.data() + block * q_op.block;
      const uint32_t* do_rows = do_op.rows.data() + block * do_op.block;
      const uint32_t* do_cols = do_op.cols.data() + block * do_op.block;

      // P = exp(scale * Q K^T - lse), masked; zero in the padding rows and keys (and so is
      // P_drop: the tiles of P_drop^T read all bq rows).
      amx.gemm(bq, bk, dp / 2, q_rows, dp / 2, w.kt.data(), bk, 16, w.p.data(), bk, 16, false);
      const float* pdrop =
          backward_probabilities(ops, mask, drop, bt, lse + bh * plan.sq + i0, s_mul, bk,
                                 w.p.data(), w.keep.data(), w.pdrop.data());
      std::fill(w.p.begin() + rows * bk, w.p.end(), 0.0f);
      std::fill(w.pdrop.begin() + rows * bk, w.pdrop.end(), 0.0f);
      // dV^T += dO^T P_drop; dP = dO V^T.
      bf16.pair_rows_blocked(pdrop, bq, bk, w.pp.data());
      amx.gemm(dp, bk, bq / 2, do_cols, bq / 2, w.pp.data(), 16, bq / 2 * 16, w.dvt.data(), 16,
               dp * 16, true);
      amx.gemm(bq, bk, dp / 2, do_rows, dp / 2, w.vt.data(), bk, 16, w.ds.data(), bk, 16, false);
      // Through dropout; dS = P * (dP - delta); zero in the padding rows.
      ops.ds_rows(w.p.data(), drop.enabled() ? w.keep.data() : nullptr,
                  delta.data() + bh * plan.sq + i0, rows, bk, w.ds.data());
      std::fill(w.ds.begin() + rows * bk, w.ds.end(), 0.0f);
      // dK^T += Q^T dS; dQ += dS K into the shared accumulator (scale applied when storing).
      bf16.pair_rows_blocked(w.ds.data(), bq, bk, w.dsp.data());
      amx.gemm(dp, bk, bq / 2, q_cols, bq / 2, w.dsp.data(), 16, bq / 2 * 16, w.dkt.data(), 16,
               dp * 16, true);
      bf16.to_bf16(w.ds.data(), reinterpret_cast<uint16_t*>(w.dsb.data()), bq * bk);
      std::lock_guard<std::mutex> lock(dq_locks[block]);
      amx.gemm(bq, dp, bk / 2, w.dsb.data(), bk / 2, w.kp.data(), 16, bk / 2 * 16,
               dq_acc.data() + block * bq * dp, 16, bq * 16, true);
    });
    // dK and dV are the transposes of the accumulators.
    for (auto [acc, view, scale] : {std::tuple{&w.dkt, &dk, plan.scale}, {&w.dvt, &dv, 1.0f}}) {
      for (int64_t g = 0; g * 16 < cols; ++g) {
        ops.transpose(acc->data() + g * dp * 16, 16, d, std::min<int64_t>(16, cols - g * 16),
                      w.row.data() + g * 16 * dp, dp, nullptr);
      }
      for (int64_t j = 0; j < cols; ++j)
        store_row(*view, b, hk, j0 + j, w.row.data() + j * dp, scale);
    }
  });

  store_dq(dq, plan, dq_acc.data(), team, /*column_blocks=*/true);
}

}  // namespace tessel::kernels::attention::internal
