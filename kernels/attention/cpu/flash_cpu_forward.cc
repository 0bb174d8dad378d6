// flash_cpu forward: FlashAttention-2's outer loop over query blocks, inner loop over key
// blocks with an online softmax (running max m, running sum l, rescaled output accumulator).

#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/flash_common.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::attention {

using namespace internal;

namespace {

// K^T and V of every (batch, kv head) in f32, padded to whole blocks: the kernels' B operands.
struct PackedKv {
  std::vector<float> kt;  // [B * H_kv][kv_blocks][dp][bk]
  std::vector<float> v;   // [B * H_kv][kv_blocks * bk][dp]
  int64_t kt_head = 0, v_head = 0;
};

PackedKv pack_kv(const AttentionProblem& p, const FlashPlan& plan, const ForkJoin& team) {
  PackedKv packed;
  const int64_t padded = plan.kv_blocks * plan.bk;
  packed.kt_head = packed.v_head = padded * plan.dp;
  const int64_t heads = plan.batch * plan.kv_heads;
  packed.kt.resize(heads * packed.kt_head);
  packed.v.resize(heads * packed.v_head);
  std::vector<std::vector<float>> scratch(team.threads());
  team.run(heads * plan.kv_blocks, [&](int worker, int64_t task) {
    const int64_t bh = task / plan.kv_blocks, kb = task % plan.kv_blocks;
    const int64_t b = bh / plan.kv_heads, h = bh % plan.kv_heads;
    const int64_t j0 = kb * plan.bk, rows = std::min(plan.bk, plan.sk - j0);
    auto& tmp = scratch[worker];
    tmp.resize(plan.bk * plan.dp);
    load_rows_transposed(p.k, b, h, j0, rows, plan.bk, plan.dp,
                         packed.kt.data() + bh * packed.kt_head + kb * plan.bk * plan.dp,
                         tmp.data());
    load_rows(p.v, b, h, j0, rows, plan.bk,
              packed.v.data() + bh * packed.v_head + j0 * plan.dp, plan.dp);
  });
  return packed;
}

// One worker's tiles.
struct ForwardScratch {
  std::vector<float> q, s, o, m, l, keep;
  explicit ForwardScratch(const FlashPlan& plan)
      : q(plan.bq * plan.dp), s(plan.bq * plan.bk), o(plan.bq * plan.dp), m(plan.bq),
        l(plan.bq), keep(plan.bk) {}
};

}  // namespace

void flash_cpu_forward(const AttentionProblem& p, const AttentionView& out, float* lse,
                       const FlashCpuOptions& options) {
  const FlashPlan plan = make_flash_plan(p, options);
  validate_attention_output(out, p.q, "out");
  if (plan.batch * plan.q_heads * plan.sq == 0) return;
  const ForkJoin team(plan.threads);
  const MaskEvaluator mask(p);
  const DropoutMask drop(p.dropout.p, p.dropout.seed, p.dropout.offset);
  const PackedKv kv = plan.sk > 0 ? pack_kv(p, plan, team) : PackedKv{};
  const TileOps& ops = *plan.ops;
  const int64_t bq = plan.bq, bk = plan.bk, dp = plan.dp;
  // Scores in log2 units: q is scaled by scale * log2(e) so the softmax uses exp2.
  const float q_mul = plan.scale * kLog2e;
  std::vector<ForwardScratch> scratch(team.threads(), ForwardScratch(plan));

  // Heaviest tasks first: under a causal mask the last query blocks see the most keys.
  const int64_t tasks = plan.batch * plan.q_heads * plan.q_blocks;
  team.run(tasks, [&](int worker, int64_t task) {
    const int64_t ib = plan.q_blocks - 1 - task % plan.q_blocks;
    const int64_t bh = task / plan.q_blocks;
    const int64_t b = bh / plan.q_heads, h = bh % plan.q_heads;
    const int64_t bkv = b * plan.kv_heads + h / plan.group;
    const int64_t i0 = ib * bq, rows = std::min(bq, plan.sq - i0);
    ForwardScratch& w = scratch[worker];
    load_rows(p.q, b, h, i0, rows, rows, w.q.data(), dp, q_mul);
    std::fill(w.o.begin(), w.o.end(), 0.0f);
    std::fill(w.m.begin(), w.m.end(), kNegInf);
    std::fill(w.l.begin(), w.l.end(), 0.0f);

    for (int64_t kb = 0; kb < plan.kv_blocks; ++kb) {
      const int64_t j0 = kb * bk, cols = std::min(bk, plan.sk - j0);
      const TileClass tile = mask.is_dense() && p.mask.prefix_lengths.empty()
                                 ? TileClass::kFull
                                 : mask.classify(b, i0, i0 + rows, j0, j0 + cols);
      if (tile == TileClass::kEmpty) continue;
      // S = Q K^T for the tile.
      const float* kt = kv.kt.data() + bkv * kv.kt_head + kb * bk * dp;
      ops.gemm(rows, bk, dp, w.q.data(), dp, 1, kt, bk, w.s.data(), bk, false);
      for (int64_t r = 0; r < rows; ++r) {
        float* srow = w.s.data() + r * bk;
        if (tile == TileClass::kPartial) {
          mask_tile_row(mask, b, h, i0 + r, j0, cols, srow);
        }
        std::fill(srow + cols, srow + bk, kNegInf);
        // Online softmax: new running max, rescale the running sum and output row.
        const float m_new = std::max(w.m[r], ops.row_max(srow, bk));
        if (m_new == kNegInf) {
          std::fill(srow, srow + bk, 0.0f);
          continue;
        }
        const float alpha = std::exp2(w.m[r] - m_new);
        const float sum = ops.exp2_affine(srow, bk, 1.0f, m_new);
        w.l[r] = w.l[r] * alpha + sum;
        w.m[r] = m_new;
        if (alpha != 1.0f) {
          float* orow = w.o.data() + r * dp;
          for (int64_t c = 0; c < dp; ++c) orow[c] *= alpha;
        }
        if (drop.enabled()) {
          drop.fill(b, h, i0 + r, j0, cols, w.keep.data());
          for (int64_t c = 0; c < cols; ++c) srow[c] *= w.keep[c];
        }
      }
      // O += P V for the tile.
      const float* v = kv.v.data() + bkv * kv.v_head + j0 * dp;
      ops.gemm(rows, dp, cols, w.s.data(), bk, 1, v, dp, w.o.data(), dp, true);
    }

    for (int64_t r = 0; r < rows; ++r) {
      const float l = w.l[r];
      store_row(out, b, h, i0 + r, w.o.data() + r * dp, l > 0 ? 1.0f / l : 0.0f);
      if (lse) {
        lse[bh * plan.sq + i0 + r] = l > 0 ? w.m[r] * kLn2 + std::log(l) : kNegInf;
      }
    }
  });
}

}  // namespace tessel::attention
