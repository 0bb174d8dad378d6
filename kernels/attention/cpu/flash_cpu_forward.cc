// flash_cpu forward: FlashAttention-2's outer loop over query blocks, inner loop over key
// blocks with an online softmax (running max m, running sum l, rescaled output accumulator).
// The tiles are kept transposed — scores S^T = K Q^T (keys x queries), output O^T = V^T P^T
// (D x queries) — so that K and V are the GEMMs' broadcast operands, read where they lie (any
// strides) for f32 inputs, with no per-call copy, and the softmax runs with vectors along the
// queries. Two GEMM flavours share the softmax step: f32 (bf16 inputs converted once per
// call) and, for bf16 inputs on CPUs with AVX512-BF16, bf16 pairs through vdpbf16ps or AMX
// tiles (P is rounded to bf16 before P V, as FlashAttention does on GPUs).

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

// Queries per panel when a partial tile of a causal/window mask is computed panel by panel.
constexpr int64_t kPanel = 32;

// Keys [*lo, *hi) of the tile [j0, j0 + cols) that some query in [i_begin, i_end) sees under a
// range mask (relative to j0; *lo >= *hi when none does).
void panel_keys(const MaskEvaluator& mask, int64_t i_begin, int64_t i_end, int64_t j0, int64_t cols,
                int64_t* lo, int64_t* hi) {
  *lo = cols;
  *hi = 0;
  for (int64_t i = i_begin; i < i_end; ++i) {
    int64_t a, z;
    mask.window_range(i, &a, &z);
    a = std::clamp<int64_t>(a - j0, 0, cols);
    z = std::clamp<int64_t>(z - j0, a, cols);
    if (a < z) *lo = std::min(*lo, a), *hi = std::max(*hi, z);
  }
}

// Where the GEMMs read K and V of one (batch, kv head): f32 element (j, c) of K at
// k[j * k_row + c * k_col] (V likewise), in the inputs themselves when they are f32, else in
// f32 copies made once per call. bf16 dot products: K as rows of pairs along D
// (k_pairs[.][S_k][dp/2]), V paired along the keys (v_pairs[.][kv_blocks * bk / 2][dp]); for
// AMX, where V^T is the A operand, each key block of V^T as rows of pairs along the keys
// (v_pairs[.][kv_blocks][dp][bk / 2]).
struct KvOperands {
  const AttentionProblem* p = nullptr;
  int64_t kv_heads = 0;
  Workspace<float> k_copy, v_copy;  // [B * H_kv][S_k][dp] when the inputs are bf16
  Workspace<uint32_t> k_pairs, v_pairs;
  int64_t head = 0;  // elements of a copy per (batch, kv head)
  int64_t k_row = 0, k_col = 0, v_row = 0, v_col = 0;

  const float* k(int64_t bkv, int64_t j) const { return f32(p->k, k_copy, bkv, j); }
  const float* v(int64_t bkv, int64_t j) const { return f32(p->v, v_copy, bkv, j); }

 private:
  const float* f32(const AttentionView& view, const Workspace<float>& copy, int64_t bkv,
                   int64_t j) const {
    if (copy.empty()) {
      return static_cast<const float*>(view.data) +
             view.offset(bkv / kv_heads, bkv % kv_heads, j, 0);
    }
    return copy.data() + bkv * head + j * k_row;
  }
};

KvOperands prepare_kv(const AttentionProblem& p, const FlashPlan& plan, bool pairs, bool amx,
                      const ForkJoin& team) {
  KvOperands kv;
  kv.p = &p;
  kv.kv_heads = plan.kv_heads;
  const int64_t heads = plan.batch * plan.kv_heads, bk = plan.bk, dp = plan.dp;
  if (!pairs && p.k.dtype == DType::kF32) {  // read in place
    kv.k_row = p.k.strides[2];
    kv.k_col = p.k.strides[3];
    kv.v_row = p.v.strides[2];
    kv.v_col = p.v.strides[3];
    return kv;
  }
  if (pairs) {
    kv.head = plan.kv_blocks * bk * dp / 2;
    kv.k_pairs = Workspace<uint32_t>(heads * kv.head);
    kv.v_pairs = Workspace<uint32_t>(heads * kv.head);
  } else {
    kv.head = plan.kv_blocks * bk * dp;
    kv.k_copy = Workspace<float>(heads * kv.head);
    kv.v_copy = Workspace<float>(heads * kv.head);
    kv.k_row = kv.v_row = dp;
    kv.k_col = kv.v_col = 1;
  }
  std::vector<std::vector<uint16_t>> bits(team.threads());
  team.run(heads * plan.kv_blocks, [&](int worker, int64_t task) {
    const int64_t bh = task / plan.kv_blocks, kb = task % plan.kv_blocks;
    const int64_t b = bh / plan.kv_heads, h = bh % plan.kv_heads;
    const int64_t j0 = kb * bk, rows = std::min(bk, plan.sk - j0);
    if (!pairs) {
      load_rows(p.k, b, h, j0, rows, bk, kv.k_copy.data() + bh * kv.head + j0 * dp, dp);
      load_rows(p.v, b, h, j0, rows, bk, kv.v_copy.data() + bh * kv.head + j0 * dp, dp);
      return;
    }
    // K: a bf16 row zero padded to dp is its row of pairs along D.
    uint16_t* k = reinterpret_cast<uint16_t*>(kv.k_pairs.data() + bh * kv.head + j0 * dp / 2);
    for (int64_t r = 0; r < rows; ++r) load_row_bf16(p.k, b, h, j0 + r, k + r * dp, dp);
    std::fill(k + rows * dp, k + bk * dp, uint16_t{0});
    auto& vb = bits[worker];  // this block's V rows as bf16 bits, zero padded
    vb.assign(bk * dp, 0);
    for (int64_t r = 0; r < rows; ++r) load_row_bf16(p.v, b, h, j0 + r, vb.data() + r * dp, dp);
    uint32_t* v = kv.v_pairs.data() + bh * kv.head + (j0 / 2) * dp;
    for (int64_t t = 0; t < bk / 2; ++t) {
      for (int64_t c = 0; c < dp; ++c) {
        const uint32_t two = bf16_pair(vb[2 * t * dp + c], vb[(2 * t + 1) * dp + c]);
        if (amx) {
          v[c * (bk / 2) + t] = two;
        } else {
          v[t * dp + c] = two;
        }
      }
    }
  });
  return kv;
}

// One worker's tiles; n = query block padded to kTileWidth, `blocks` query blocks per task
// (each with its own Q^T, O^T, m and l, block after block). qt: Q^T (dp x n), st: S^T then
// P^T (bk x n), ot: O^T (dp x n); m, l, alpha per query; rows: Q or O rows (bq x dp) where
// they cannot be read or written in place.
struct ForwardScratch {
  TileVector<float> qt, st, ot, m, l, alpha, keep, rows;
  TileVector<uint32_t> qt_pairs, pt_pairs;  // bf16 path: Q^T, P^T paired along D, the keys
  std::vector<uint16_t> bits;
  std::vector<int64_t> panel_lo, panel_hi;  // keys each query panel computes (partial tiles)
  TileVector<float> keep_tile;  // AMX path with dropout: the keep mask of a tile, like st
  int64_t blocks;
  // A task's start: O^T's first `out_rows` rows zero in every block, no maximum, no sum.
  void reset(int64_t out_rows, int64_t n) {
    for (size_t o = 0; o < ot.size(); o += ot.size() / blocks) {
      std::fill(ot.begin() + o, ot.begin() + o + out_rows * n, 0.0f);
    }
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.0f);
  }
  // Only the Q^T and P^T layouts the plan's GEMMs read are allocated (f32 or bf16 pairs).
  ForwardScratch(const FlashPlan& plan, int64_t n, int64_t blocks)
      : qt(plan.bf16 ? 0 : blocks * plan.dp * n),
        st(plan.bk * n),
        ot(blocks * plan.dp * n),
        m(blocks * n),
        l(blocks * n),
        alpha(n),
        keep(plan.bk * std::max(n, plan.bq)),
        rows(plan.bq * plan.dp),
        qt_pairs(plan.bf16 ? blocks * plan.dp / 2 * n : 0),
        pt_pairs(plan.bf16 ? plan.bk / 2 * n : 0),
        bits(plan.dp),
        panel_lo(ceil_div(n, kPanel)),
        panel_hi(ceil_div(n, kPanel)),
        keep_tile(plan.amx ? plan.bk * n : 0),
        blocks(blocks) {}
};

// The class of the tile of query rows [i0, i0 + rows) and keys [j0, j0 + cols) of batch b.
TileClass forward_tile_class(const AttentionProblem& p, const MaskEvaluator& mask, int64_t b,
                             int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
  return mask.is_dense() && p.mask.prefix_lengths.empty()
             ? TileClass::kFull
             : mask.classify(b, i0, i0 + rows, j0, j0 + cols);
}

// Where one forward task works: batch, query head, its kv row (b * H_kv + kv head), and the
// query rows [i0, i0 + rows).
struct ForwardTask {
  int64_t b, h, bkv, i0, rows;
};

// One forward task on AMX tiles. Every tile lies by column blocks of 16 queries, each block's
// rows contiguous (see AmxTileOps::gemm): Q^T pairs [n / 16][dp / 2][16], S^T [n / 16][bk][16],
// P^T pairs [n / 16][bk / 2][16], O^T [n / 16][dp][16]. The softmax step writes P^T as bf16
// pairs directly (Bf16TileOps::softmax_pairs).
void forward_task_amx(const AttentionProblem& p, const FlashPlan& plan, const KvOperands& kv,
                      const MaskEvaluator& mask, const DropoutMask& drop, const ForwardTask& t,
                      ForwardScratch& w, const AttentionView& out, float* lse) {
  const AmxTileOps& amx = *plan.amx;
  const Bf16TileOps& bf16 = *plan.bf16;
  const int64_t bk = plan.bk, d = plan.d, dp = plan.dp, n = round_up(plan.bq, kTileWidth);
  const int64_t q_tile = dp / 2 * 16, s_tile = bk * 16, p_tile = bk / 2 * 16, o_tile = dp * 16;
  const float s_mul = plan.scale * kLog2e;
  const AmxTileScope tiles(&amx);
  std::fill(w.qt_pairs.begin(), w.qt_pairs.end(), 0u);
  for (int64_t r = 0; r < t.rows; ++r) {
    load_row_bf16(p.q, t.b, t.h, t.i0 + r, w.bits.data(), dp);
    uint32_t* col = w.qt_pairs.data() + r / 16 * q_tile + r % 16;
    for (int64_t u = 0; u < dp / 2; ++u) col[u * 16] = bf16_pair(w.bits[2 * u], w.bits[2 * u + 1]);
  }
  w.reset(dp, n);

  for (int64_t kb = 0; kb < plan.kv_blocks; ++kb) {
    const int64_t j0 = kb * bk, cols = std::min(bk, plan.sk - j0);
    const TileClass tile = forward_tile_class(p, mask, t.b, t.i0, t.rows, j0, cols);
    if (tile == TileClass::kEmpty) continue;
    // S^T = K Q^T over whole tiles (K's padding keys are zero).
    amx.gemm(bk, n, dp / 2, kv.k_pairs.data() + t.bkv * kv.head + j0 * dp / 2, dp / 2,
             w.qt_pairs.data(), 16, q_tile, w.st.data(), 16, s_tile, false);
    if (tile == TileClass::kPartial) {
      for (int64_t r = 0; r < t.rows; ++r) {
        mask_tile_row(mask, t.b, t.h, t.i0 + r, j0, cols, w.st.data() + r / 16 * s_tile + r % 16,
                      16);
      }
    }
    if (drop.enabled()) {
      drop.fill_rows(t.b, t.h, t.i0, t.rows, j0, cols, w.keep.data(), bk);
      for (int64_t r = 0; r < t.rows; ++r) {
        const float* keep = w.keep.data() + r * bk;
        float* col = w.keep_tile.data() + r / 16 * s_tile + r % 16;
        for (int64_t c = 0; c < cols; ++c) col[c * 16] = keep[c];
      }
    }
    // Online softmax (rescales O^T) into P^T pairs, then O^T += V^T P^T.
    for (int64_t q = 0; q < n / 16; ++q) {
      bf16.softmax_pairs(w.st.data() + q * s_tile, cols, s_mul,
                         drop.enabled() ? w.keep_tile.data() + q * s_tile : nullptr,
                         w.m.data() + q * 16, w.l.data() + q * 16, w.ot.data() + q * o_tile, d,
                         w.alpha.data() + q * 16, w.pt_pairs.data() + q * p_tile, bk / 2);
    }
    amx.gemm(dp, n, bk / 2, kv.v_pairs.data() + t.bkv * kv.head + (j0 / 2) * dp, bk / 2,
             w.pt_pairs.data(), 16, p_tile, w.ot.data(), 16, o_tile, true);
  }

  // out = (O^T)^T / l; rows that saw no key get 0.
  const int64_t bh = t.b * plan.q_heads + t.h;
  for (int64_t r = 0; r < t.rows; ++r) {
    const float l = w.l[r];
    w.alpha[r] = l > 0 ? 1.0f / l : 0.0f;
    if (lse) lse[bh * plan.sq + t.i0 + r] = l > 0 ? w.m[r] * kLn2 + std::log(l) : kNegInf;
  }
  for (int64_t q = 0; q * 16 < t.rows; ++q) {
    const int64_t count = std::min<int64_t>(16, t.rows - q * 16);
    plan.ops->transpose(w.ot.data() + q * o_tile, 16, d, count, w.rows.data() + q * 16 * dp, dp,
                        w.alpha.data() + q * 16);
  }
  for (int64_t r = 0; r < t.rows; ++r) store_row(out, t.b, t.h, t.i0 + r, w.rows.data() + r * dp);
}

// One forward task with FMA GEMMs: f32 (bf16 inputs converted once per call) or bf16 pairs
// through vdpbf16ps. Its query blocks (bq rows each from t.i0, at most w.blocks) meet the key
// blocks in turn, so that each K and V block is fetched once for all of them.
void forward_task_fma(const AttentionProblem& p, const FlashPlan& plan, const KvOperands& kv,
                      const MaskEvaluator& mask, const DropoutMask& drop, const ForwardTask& t,
                      ForwardScratch& w, const AttentionView& out, float* lse) {
  const TileOps& ops = *plan.ops;
  const Bf16TileOps* bf16 = plan.bf16;  // null: f32 GEMMs
  const int64_t bq = plan.bq, bk = plan.bk, d = plan.d, dp = plan.dp;
  const int64_t n = round_up(bq, kTileWidth);
  // Scores in log2 units (the softmax uses exp2): the softmax step multiplies by
  // scale * log2(e).
  const float s_mul = plan.scale * kLog2e;
  // f32 rows with unit stride along D are read (Q) and written (out) in place.
  const bool q_in_place = p.q.dtype == DType::kF32 && p.q.strides[3] == 1;
  const bool out_in_place = out.dtype == DType::kF32 && out.strides[3] == 1;
  const int64_t blocks = ceil_div(t.rows, bq);
  // Query block g: rows [i0, i0 + rows) and its Q^T, O^T, running maxima and sums.
  struct Block {
    int64_t i0, rows;
    float *qt, *ot, *m, *l;
    uint32_t* qt_pairs;
  };
  auto block = [&](int64_t g) {  // only the Q^T layout the GEMMs read is allocated
    return Block{t.i0 + g * bq,
                 std::min(bq, t.rows - g * bq),
                 bf16 ? nullptr : w.qt.data() + g * dp * n,
                 w.ot.data() + g * dp * n,
                 w.m.data() + g * n,
                 w.l.data() + g * n,
                 bf16 ? w.qt_pairs.data() + g * dp / 2 * n : nullptr};
  };

  // Q^T, zero in the padding columns [rows, n) and rows [D, dp).
  for (int64_t g = 0; g < blocks; ++g) {
    const Block q = block(g);
    if (bf16) {
      std::fill(q.qt_pairs, q.qt_pairs + dp / 2 * n, 0u);
      for (int64_t r = 0; r < q.rows; ++r) {
        load_row_bf16(p.q, t.b, t.h, q.i0 + r, w.bits.data(), dp);
        for (int64_t u = 0; u < dp / 2; ++u) {
          q.qt_pairs[u * n + r] = bf16_pair(w.bits[2 * u], w.bits[2 * u + 1]);
        }
      }
    } else {
      const float* rows = w.rows.data();
      int64_t ld = dp;
      if (q_in_place) {
        rows = static_cast<const float*>(p.q.data) + p.q.offset(t.b, t.h, q.i0, 0);
        ld = p.q.strides[2];
      } else {
        load_rows(p.q, t.b, t.h, q.i0, q.rows, q.rows, w.rows.data(), dp);
      }
      ops.transpose(rows, ld, q.rows, d, q.qt, n, nullptr);
      for (int64_t c = 0; q.rows < n && c < d; ++c) {
        std::fill(q.qt + c * n + q.rows, q.qt + (c + 1) * n, 0.0f);
      }
    }
  }
  w.reset(d, n);

  for (int64_t kb = 0; kb < plan.kv_blocks; ++kb) {
    const int64_t j0 = kb * bk, cols = std::min(bk, plan.sk - j0);
    for (int64_t g = 0; g < blocks; ++g) {
      const Block q = block(g);
      const TileClass tile = forward_tile_class(p, mask, t.b, q.i0, q.rows, j0, cols);
      if (tile == TileClass::kEmpty) continue;
      // S^T = K Q^T. A partial tile of a causal/window mask goes panel by panel over only the
      // keys the panel's queries see (about half of a diagonal tile is never computed); the
      // entries left out are masked below like any invisible key, and P V skips them too.
      const bool by_panel = !bf16 && tile == TileClass::kPartial && mask.rows_are_ranges();
      if (by_panel) {
        for (int64_t q0 = 0, u = 0; q0 < n; q0 += kPanel, ++u) {
          int64_t& lo = w.panel_lo[u];
          int64_t& hi = w.panel_hi[u];
          panel_keys(mask, q.i0 + q0, q.i0 + std::min(q.rows, q0 + kPanel), j0, cols, &lo, &hi);
          if (lo >= hi) continue;
          ops.gemm(hi - lo, std::min(kPanel, n - q0), d, kv.k(t.bkv, j0 + lo), kv.k_row, kv.k_col,
                   q.qt + q0, n, w.st.data() + lo * n + q0, n, false);
        }
      } else if (bf16) {
        bf16->gemm(cols, n, dp / 2, kv.k_pairs.data() + t.bkv * kv.head + j0 * dp / 2, dp / 2, 1,
                   q.qt_pairs, n, w.st.data(), n, false);
      } else {
        ops.gemm(cols, n, d, kv.k(t.bkv, j0), kv.k_row, kv.k_col, q.qt, n, w.st.data(), n, false);
      }
      // Mask, online softmax (rescales O^T), dropout.
      if (tile == TileClass::kPartial) {
        for (int64_t r = 0; r < q.rows; ++r) {
          mask_tile_row(mask, t.b, t.h, q.i0 + r, j0, cols, w.st.data() + r, n);
        }
      }
      ops.softmax_step(w.st.data(), cols, n, s_mul, q.m, q.l, q.ot, d, w.alpha.data());
      if (drop.enabled()) {
        drop.fill_rows(t.b, t.h, q.i0, q.rows, j0, cols, w.keep.data(), bk);
        for (int64_t r = 0; r < q.rows; ++r) {
          if (q.m[r] == kNegInf) continue;  // an all-zero column
          const float* keep = w.keep.data() + r * bk;
          for (int64_t c = 0; c < cols; ++c) w.st[c * n + r] *= keep[c];
        }
      }
      // O^T += V^T P^T.
      if (bf16) {
        for (int64_t u = 0; 2 * u < cols; ++u) {
          bf16->to_bf16_pairs(w.st.data() + 2 * u * n,
                              2 * u + 1 < cols ? w.st.data() + (2 * u + 1) * n : nullptr,
                              w.pt_pairs.data() + u * n, n);
        }
        bf16->gemm(d, n, (cols + 1) / 2, kv.v_pairs.data() + t.bkv * kv.head + (j0 / 2) * dp, 1, dp,
                   w.pt_pairs.data(), n, q.ot, n, true);
      } else if (by_panel) {
        for (int64_t q0 = 0, u = 0; q0 < n; q0 += kPanel, ++u) {
          const int64_t lo = w.panel_lo[u], hi = w.panel_hi[u];
          if (lo >= hi) continue;
          ops.gemm(d, std::min(kPanel, n - q0), hi - lo, kv.v(t.bkv, j0 + lo), kv.v_col, kv.v_row,
                   w.st.data() + lo * n + q0, n, q.ot + q0, n, true);
        }
      } else {
        ops.gemm(d, n, cols, kv.v(t.bkv, j0), kv.v_col, kv.v_row, w.st.data(), n, q.ot, n, true);
      }
    }
  }

  // out = (O^T)^T / l; rows that saw no key get 0.
  const int64_t bh = t.b * plan.q_heads + t.h;
  for (int64_t g = 0; g < blocks; ++g) {
    const Block q = block(g);
    for (int64_t r = 0; r < q.rows; ++r) {
      const float l = q.l[r];
      w.alpha[r] = l > 0 ? 1.0f / l : 0.0f;
      if (lse) lse[bh * plan.sq + q.i0 + r] = l > 0 ? q.m[r] * kLn2 + std::log(l) : kNegInf;
    }
    if (out_in_place) {
      ops.transpose(q.ot, n, d, q.rows,
                    static_cast<float*>(out.data) + out.offset(t.b, t.h, q.i0, 0), out.strides[2],
                    w.alpha.data());
    } else {
      ops.transpose(q.ot, n, d, q.rows, w.rows.data(), dp, w.alpha.data());
      for (int64_t r = 0; r < q.rows; ++r) {
        store_row(out, t.b, t.h, q.i0 + r, w.rows.data() + r * dp);
      }
    }
  }
}

// Query blocks per FMA task. Several share each K and V block they fetch, which pays once a
// head's K and V outgrow about half of a 2 MiB L2 cache (S 2048, D 128: 2 MiB; one fetch per
// query block made it the slowest configuration) and costs a little below that (the blocks'
// Q^T and O^T leave L1). The call keeps kMinTasksPerThread tasks per thread for the balance.
constexpr int64_t kMaxQueryGroup = 4, kMinTasksPerThread = 4;
constexpr int64_t kKvBytesInL2 = int64_t{1} << 20;
int64_t forward_query_group(const FlashPlan& plan) {
  if (2 * plan.sk * plan.dp * int64_t{sizeof(float)} <= kKvBytesInL2) return 1;
  int64_t group = kMaxQueryGroup;
  while (group > 1 && plan.batch * plan.q_heads * ceil_div(plan.q_blocks, group) <
                          kMinTasksPerThread * plan.threads) {
    group /= 2;
  }
  return group;
}

// The forward's tasks in the order workers take them: per (batch, head) its groups of query
// blocks, heaviest first (under a causal mask the last query blocks see the most keys). The
// call's last `threads` groups are split into single blocks, so that a worker that runs out of
// tasks waits for at most one block of another's, not a group (a group of four at S 2048,
// D 128 lasts about 1.4 ms).
std::vector<ForwardTask> forward_tasks(const FlashPlan& plan, int64_t group) {
  std::vector<ForwardTask> tasks;
  const int64_t groups = ceil_div(plan.q_blocks, group);
  auto add = [&](int64_t bh, int64_t i0, int64_t rows) {
    const int64_t b = bh / plan.q_heads, h = bh % plan.q_heads;
    tasks.push_back({b, h, b * plan.kv_heads + h / plan.group, i0, rows});
  };
  for (int64_t bh = 0; bh < plan.batch * plan.q_heads; ++bh) {
    for (int64_t ig = groups - 1; ig >= 0; --ig) {
      const int64_t i0 = ig * group * plan.bq;
      add(bh, i0, std::min(group * plan.bq, plan.sq - i0));
    }
  }
  if (group == 1) return tasks;
  const size_t split = std::min<size_t>(tasks.size(), plan.threads);
  const std::vector<ForwardTask> last(tasks.end() - split, tasks.end());
  tasks.resize(tasks.size() - split);
  for (const ForwardTask& t : last) {
    for (int64_t i0 = t.i0 + round_up(t.rows, plan.bq) - plan.bq; i0 >= t.i0; i0 -= plan.bq) {
      add(t.b * plan.q_heads + t.h, i0, std::min(plan.bq, t.i0 + t.rows - i0));
    }
  }
  return tasks;
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
  const KvOperands kv = plan.sk > 0
                            ? prepare_kv(p, plan, plan.bf16 != nullptr, plan.amx != nullptr, team)
                            : KvOperands{};
  const int64_t n = round_up(plan.bq, kTileWidth);
  const int64_t group = plan.amx ? 1 : forward_query_group(plan);  // query blocks per task
  std::vector<ForwardScratch> scratch;  // one per worker, each zeroed once
  scratch.reserve(team.threads());
  for (int worker = 0; worker < team.threads(); ++worker) scratch.emplace_back(plan, n, group);
  const std::vector<ForwardTask> tasks = forward_tasks(plan, group);
  team.run(static_cast<int64_t>(tasks.size()), [&](int worker, int64_t task) {
    const ForwardTask& t = tasks[task];
    if (plan.amx) {
      forward_task_amx(p, plan, kv, mask, drop, t, scratch[worker], out, lse);
    } else {
      forward_task_fma(p, plan, kv, mask, drop, t, scratch[worker], out, lse);
    }
  });
}

}  // namespace tessel::kernels::attention
