// flash_cpu forward: FlashAttention-2's outer loop over query blocks, inner loop over key
// blocks with an online softmax (running max m, running sum l, rescaled output accumulator).
// Two GEMM flavours share the softmax step: f32 (any input, bf16 converted while packing) and,
// for bf16 inputs on CPUs with AVX512-BF16, bf16 pairs through vdpbf16ps (P is rounded to bf16
// before P V, as FlashAttention does on GPUs).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/flash_common.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::kernels::attention {

using namespace internal;

namespace {

// K^T and V of every (batch, kv head), padded to whole blocks: the kernels' B operands.
// f32: kt [B*H_kv][kv_blocks][dp][bk], v [B*H_kv][kv_blocks*bk][dp].
// bf16 pairs (uint32_t = two bf16): kt [..][kv_blocks][dp/2][bk] pairs along D,
// v [..][kv_blocks*bk/2][dp] pairs along the keys.
struct PackedKv {
  std::vector<float> kt, v;
  std::vector<uint32_t> kt_pairs, v_pairs;
  int64_t head = 0;  // elements (f32) or pairs per (batch, kv head), K and V alike
};

// Raw bf16 bits of view[b, h, s, :] into dst[0..D); zeros in [D, ld).
void load_bf16_bits(const AttentionView& view, int64_t b, int64_t h, int64_t s, uint16_t* dst,
                    int64_t ld) {
  const uint16_t* src = static_cast<const uint16_t*>(view.data) + view.offset(b, h, s, 0);
  const int64_t d = view.head_dim(), ds = view.strides[3];
  for (int64_t c = 0; c < d; ++c) dst[c] = src[c * ds];
  std::fill(dst + d, dst + ld, uint16_t{0});
}

uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }

PackedKv pack_kv(const AttentionProblem& p, const FlashPlan& plan, bool pairs,
                 const ForkJoin& team) {
  PackedKv packed;
  const int64_t heads = plan.batch * plan.kv_heads, bk = plan.bk, dp = plan.dp;
  if (pairs) {
    packed.head = plan.kv_blocks * bk * dp / 2;
    packed.kt_pairs.resize(heads * packed.head);
    packed.v_pairs.resize(heads * packed.head);
  } else {
    packed.head = plan.kv_blocks * bk * dp;
    packed.kt.resize(heads * packed.head);
    packed.v.resize(heads * packed.head);
  }
  std::vector<std::vector<float>> scratch(team.threads());
  std::vector<std::vector<uint16_t>> bits(team.threads());
  team.run(heads * plan.kv_blocks, [&](int worker, int64_t task) {
    const int64_t bh = task / plan.kv_blocks, kb = task % plan.kv_blocks;
    const int64_t b = bh / plan.kv_heads, h = bh % plan.kv_heads;
    const int64_t j0 = kb * bk, rows = std::min(bk, plan.sk - j0);
    if (!pairs) {
      auto& tmp = scratch[worker];
      tmp.resize(bk * dp);
      load_rows_transposed(p.k, b, h, j0, rows, bk, dp,
                           packed.kt.data() + bh * packed.head + kb * bk * dp, tmp.data());
      load_rows(p.v, b, h, j0, rows, bk, packed.v.data() + bh * packed.head + j0 * dp, dp);
      return;
    }
    auto& kb_bits = bits[worker];  // this block's K and V rows as bf16 bits, zero padded
    kb_bits.assign(2 * bk * dp, 0);
    uint16_t* kr = kb_bits.data();
    uint16_t* vr = kr + bk * dp;
    for (int64_t r = 0; r < rows; ++r) {
      load_bf16_bits(p.k, b, h, j0 + r, kr + r * dp, dp);
      load_bf16_bits(p.v, b, h, j0 + r, vr + r * dp, dp);
    }
    uint32_t* kt = packed.kt_pairs.data() + bh * packed.head + kb * bk * dp / 2;
    for (int64_t q = 0; q < dp / 2; ++q) {
      for (int64_t j = 0; j < bk; ++j) kt[q * bk + j] = pair(kr[j * dp + 2 * q], kr[j * dp + 2 * q + 1]);
    }
    uint32_t* v = packed.v_pairs.data() + bh * packed.head + (j0 / 2) * dp;
    for (int64_t t = 0; t < bk / 2; ++t) {
      for (int64_t c = 0; c < dp; ++c) v[t * dp + c] = pair(vr[2 * t * dp + c], vr[(2 * t + 1) * dp + c]);
    }
  });
  return packed;
}

// One worker's tiles.
struct ForwardScratch {
  std::vector<float> q, s, o, m, l, m_new, alpha, keep;
  std::vector<uint16_t> q_bits, p_bits;  // bf16 path: Q rows and P rows as bf16
  explicit ForwardScratch(const FlashPlan& plan)
      : q(plan.bq * plan.dp), s(plan.bq * plan.bk), o(plan.bq * plan.dp), m(plan.bq),
        l(plan.bq), m_new(plan.bq), alpha(round_up(plan.bq, kTileWidth)), keep(plan.bk),
        q_bits(plan.bq * plan.dp), p_bits(plan.bq * plan.bk) {}
};

// Turns the tile's scores (rows x bk, `cols` valid; log2 units after multiplying by `mul`)
// into probabilities with the online softmax: masks, updates m and l, rescales the output
// rows, applies dropout.
void online_softmax(const TileOps& ops, const MaskEvaluator& mask, const DropoutMask& drop,
                    TileClass tile, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                    int64_t cols, int64_t bk, int64_t dp, float mul, ForwardScratch& w) {
  // New running maxima, and the factors 2^(m_old - m_new) by one vector exp2 over the rows.
  for (int64_t r = 0; r < rows; ++r) {
    float* srow = w.s.data() + r * bk;
    if (tile == TileClass::kPartial) mask_tile_row(mask, b, h, i0 + r, j0, cols, srow);
    std::fill(srow + cols, srow + bk, kNegInf);
    w.m_new[r] = std::max(w.m[r], ops.row_max(srow, bk) * mul);  // mul > 0
    w.alpha[r] = w.m_new[r] == kNegInf ? 0.0f : w.m[r] - w.m_new[r];
  }
  std::fill(w.alpha.begin() + rows, w.alpha.end(), 0.0f);
  ops.exp2_affine(w.alpha.data(), static_cast<int64_t>(w.alpha.size()), 1.0f, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* srow = w.s.data() + r * bk;
    if (w.m_new[r] == kNegInf) {  // nothing visible yet
      std::fill(srow, srow + bk, 0.0f);
      continue;
    }
    const float alpha = w.alpha[r];
    w.l[r] = w.l[r] * alpha + ops.exp2_affine(srow, bk, mul, w.m_new[r]);
    w.m[r] = w.m_new[r];
    if (alpha != 1.0f) {
      float* orow = w.o.data() + r * dp;
      for (int64_t c = 0; c < dp; ++c) orow[c] *= alpha;
    }
    if (drop.enabled()) {
      drop.fill(b, h, i0 + r, j0, cols, w.keep.data());
      for (int64_t c = 0; c < cols; ++c) srow[c] *= w.keep[c];
    }
  }
}

}  // namespace

void flash_cpu_forward(const AttentionProblem& p, const AttentionView& out, float* lse,
                       const FlashCpuOptions& options) {
  const FlashPlan plan = make_flash_plan(p, options);
  validate_attention_output(out, p.q, "out");
  if (plan.batch * plan.q_heads * plan.sq == 0) return;
  const ForkJoin team(plan.threads);
  const MaskEvaluator mask(p);
  const DropoutMask drop(p.dropout.p, p.dropout.seed, p.dropout.offset);
  const TileOps& ops = *plan.ops;
  const Bf16TileOps* bf16 = plan.bf16;  // null: f32 GEMMs
  const PackedKv kv = plan.sk > 0 ? pack_kv(p, plan, bf16 != nullptr, team) : PackedKv{};
  const int64_t bq = plan.bq, bk = plan.bk, dp = plan.dp;
  // Scores in log2 units (the softmax uses exp2): f32 folds scale * log2(e) into Q, the bf16
  // path keeps Q exact and applies it in the softmax step.
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
    if (bf16) {
      for (int64_t r = 0; r < rows; ++r) load_bf16_bits(p.q, b, h, i0 + r, w.q_bits.data() + r * dp, dp);
    } else {
      load_rows(p.q, b, h, i0, rows, rows, w.q.data(), dp, q_mul);
    }
    std::fill(w.o.begin(), w.o.end(), 0.0f);
    std::fill(w.m.begin(), w.m.end(), kNegInf);
    std::fill(w.l.begin(), w.l.end(), 0.0f);

    for (int64_t kb = 0; kb < plan.kv_blocks; ++kb) {
      const int64_t j0 = kb * bk, cols = std::min(bk, plan.sk - j0);
      const TileClass tile = mask.is_dense() && p.mask.prefix_lengths.empty()
                                 ? TileClass::kFull
                                 : mask.classify(b, i0, i0 + rows, j0, j0 + cols);
      if (tile == TileClass::kEmpty) continue;
      if (bf16) {
        // S = Q K^T over bf16 pairs; softmax with the scale; P to bf16; O += P V.
        const auto* qp = reinterpret_cast<const uint32_t*>(w.q_bits.data());
        const uint32_t* kt = kv.kt_pairs.data() + bkv * kv.head + kb * bk * dp / 2;
        bf16->gemm(rows, bk, dp / 2, qp, dp / 2, 1, kt, bk, w.s.data(), bk, false);
        online_softmax(ops, mask, drop, tile, b, h, i0, rows, j0, cols, bk, dp, q_mul, w);
        bf16->to_bf16(w.s.data(), w.p_bits.data(), rows * bk);
        const auto* pp = reinterpret_cast<const uint32_t*>(w.p_bits.data());
        const uint32_t* v = kv.v_pairs.data() + bkv * kv.head + (j0 / 2) * dp;
        bf16->gemm(rows, dp, (cols + 1) / 2, pp, bk / 2, 1, v, dp, w.o.data(), dp, true);
      } else {
        const float* kt = kv.kt.data() + bkv * kv.head + kb * bk * dp;
        ops.gemm(rows, bk, dp, w.q.data(), dp, 1, kt, bk, w.s.data(), bk, false);
        online_softmax(ops, mask, drop, tile, b, h, i0, rows, j0, cols, bk, dp, 1.0f, w);
        const float* v = kv.v.data() + bkv * kv.head + j0 * dp;
        ops.gemm(rows, dp, cols, w.s.data(), bk, 1, v, dp, w.o.data(), dp, true);
      }
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

}  // namespace tessel::kernels::attention
