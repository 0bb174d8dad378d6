// FlashAttention-2 backward on tensor cores. Five kernels, each CTA algorithm first, then the
// kernels and their launcher; the algorithms run on the CPU too (attention_cuda_emulated_test).
//
//   1. preprocess: delta_i = rowsum(dO_i * O_i) per query row; zero the f32 dQ accumulator.
//   2. dK/dV: one CTA per (key block of kBlockN, head, batch entry); its keys' dK and dV stay in
//      registers while it walks every query block of its query head. Without GQA the head is
//      the key/value head and the CTA writes dK and dV. Under GQA/MQA the head is a query head,
//      so the query heads of a group run in parallel (H_q CTAs per key block, not H_kv), each
//      writing its partial dK, dV in f32 to a per-query-head workspace that step 5 sums. With
//      8 warps of 16 keys each, a warp computes S^T = K Q^T and dP^T = V dO^T for
//      its keys, so P^T and dS^T come out in the accumulator layout that is also the A operand
//      of dV += P^T dO and dK += dS^T Q (no shared-memory round trip, the forward's trick).
//      Only dS^T goes to shared memory, for dQ = dS K, which the CTA adds to the f32
//      accumulator with atomics (the order of those float additions varies from run to run).
//   3. dQ (deterministic backward): one CTA per (query block, query head, batch entry)
//      recomputes S and dP over its key blocks and keeps dQ in registers — no atomics, so the
//      result is bitwise reproducible; the dK/dV kernel then skips its dQ part.
//   4. postprocess: dQ = scale * accumulator, rounded to the output dtype.
//   5. GQA/MQA: dK, dV = the sums of the workspace's partials over each group's query heads, in
//      head order (so a deterministic backward stays bitwise reproducible), rounded.
// Query blocks (Q, dO, logsumexp, delta) are double-buffered: the next block's cp.async copies
// run while the current one is computed. P = exp2(S scale log2(e) - lse log2(e)) is recomputed
// from the forward's logsumexp, so nothing of size S_q x S_k is ever stored.

#include "tessel/kernels/attention/cuda/internal/flash_tiles.h"

namespace tessel::kernels::attention::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;

// The forward's natural-log logsumexp in log2 units; a row that saw no key (-inf) becomes +inf
// so that exp2(s - lse) is 0 for all of it.
TESSEL_DEVICE float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// ---- 1 and 4. Row-wise pre- and postprocessing -------------------------------------------

// kD / 8 threads per query row, one 16-byte chunk each.
template <int kD>
struct RowChunks {
  static constexpr int kChunks = kD / 8;
  static constexpr int kThreads = 128;
  static constexpr int kRows = kThreads / kChunks;  // rows per CTA
};

TESSEL_DEVICE void row_position(const FlashParams& p, int64_t row, int* b, int* h, int* i) {
  *i = static_cast<int>(row % p.q_len);
  const int64_t bh = row / p.q_len;
  *h = static_cast<int>(bh % p.q_heads);
  *b = static_cast<int>(bh / p.q_heads);
}

template <int kD, Elem E>
TESSEL_DEVICE void backward_preprocess_cta(const FlashParams& p, int block) {
  using R = RowChunks<kD>;
  const int tid = thread_index();
  const int64_t row = static_cast<int64_t>(block) * R::kRows + tid / R::kChunks;
  const int c = (tid % R::kChunks) * 8;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_heads * p.q_len;
  float sum = 0;
  if (row < rows && c < p.head_dim) {
    int b, h, i;
    row_position(p, row, &b, &h, &i);
    uint32_t o[4], d[4];
    load16(o, static_cast<const uint16_t*>(p.out.data) + p.out.offset(b, h, i) + c);
    load16(d, static_cast<const uint16_t*>(p.dout.data) + p.dout.offset(b, h, i) + c);
    TESSEL_UNROLL
    for (int k = 0; k < 4; ++k) {
      sum += to_float<E>(static_cast<uint16_t>(o[k])) * to_float<E>(static_cast<uint16_t>(d[k]));
      sum += to_float<E>(static_cast<uint16_t>(o[k] >> 16)) *
             to_float<E>(static_cast<uint16_t>(d[k] >> 16));
    }
  }
  TESSEL_UNROLL
  for (int m = 1; m < R::kChunks; m *= 2) sum += shfl_xor(sum, m);  // the row's lanes
  if (row < rows) {
    if (c == 0) p.delta[row] = sum;
    if (p.dq_accum != nullptr) {
      const uint32_t zero[4] = {0, 0, 0, 0};
      float* acc = p.dq_accum + row * kD + c;
      store16(acc, zero);
      store16(acc + 4, zero);
    }
  }
}

template <int kD, Elem E>
TESSEL_DEVICE void backward_postprocess_cta(const FlashParams& p, int block) {
  using R = RowChunks<kD>;
  const int tid = thread_index();
  const int64_t row = static_cast<int64_t>(block) * R::kRows + tid / R::kChunks;
  const int c = (tid % R::kChunks) * 8;
  if (row >= static_cast<int64_t>(p.batch) * p.q_heads * p.q_len || c >= p.head_dim) return;
  int b, h, i;
  row_position(p, row, &b, &h, &i);
  const float* acc = p.dq_accum + row * kD + c;
  uint32_t packed[4];
  TESSEL_UNROLL
  for (int k = 0; k < 4; ++k) packed[k] = pack2<E>(acc[2 * k] * p.scale, acc[2 * k + 1] * p.scale);
  store16(static_cast<uint16_t*>(p.dq.data) + p.dq.offset(b, h, i) + c, packed);
}

// kD / 8 threads per key row (b, hk, j): the group's partial dK and dV summed in head order.
template <int kD, Elem E>
TESSEL_DEVICE void backward_reduce_dkdv_cta(const FlashParams& p, int block) {
  using R = RowChunks<kD>;
  const int tid = thread_index();
  const int64_t row = static_cast<int64_t>(block) * R::kRows + tid / R::kChunks;
  const int c = (tid % R::kChunks) * 8;
  if (row >= static_cast<int64_t>(p.batch) * p.kv_heads * p.kv_len || c >= p.head_dim) return;
  const int j = static_cast<int>(row % p.kv_len);
  const int64_t bh = row / p.kv_len;
  const int hk = static_cast<int>(bh % p.kv_heads), b = static_cast<int>(bh / p.kv_heads);
  const int group = p.q_heads / p.kv_heads;
  // Partial of query head h: row ((b H_q + h) S_k + j) of the workspace.
  const int64_t first = ((static_cast<int64_t>(b) * p.q_heads + hk * group) * p.kv_len + j) * kD;
  const int64_t head_stride = static_cast<int64_t>(p.kv_len) * kD;
  for (int which = 0; which < 2; ++which) {
    const float* acc = (which == 0 ? p.dk_accum : p.dv_accum) + first + c;
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int g = 0; g < group; ++g) {
      TESSEL_UNROLL
      for (int k = 0; k < 8; ++k) sum[k] += acc[g * head_stride + k];
    }
    uint32_t packed[4];
    TESSEL_UNROLL
    for (int k = 0; k < 4; ++k) packed[k] = pack2<E>(sum[2 * k], sum[2 * k + 1]);
    const DeviceView& out = which == 0 ? p.dk : p.dv;
    store16(static_cast<uint16_t*>(out.data) + out.offset(b, hk, j) + c, packed);
  }
}

// ---- 2. dK and dV (and dQ by atomics) ----------------------------------------------------

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct BackwardTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kBlockN == 16 * kWarps, "one m-tile of 16 keys per warp");
  static constexpr int kNT = kBlockM / 8;   // S^T columns (queries) per warp, in n-tiles
  static constexpr int kDT = kHeadDim / 8;  // dK, dV columns per warp, in n-tiles
  // dQ = dS K: warps tile (kBlockM / 16 query m-tiles) x (the rest of the warps over D).
  static constexpr int kDqWarpsM = kBlockM / 16;
  static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqNT = kHeadDim / kDqWarpsD / 8;
  static_assert(kWarps % kDqWarpsM == 0 && kDqNT % 2 == 0, "dQ warp tiling");
  using KTile = SmemTile<kBlockN, kHeadDim>;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using STile = SmemTile<kBlockN, kBlockM>;
  // Shared memory: K, V, Q[2], dO[2], dS^T, then logsumexp[2] and delta[2] (f32 rows).
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + KTile::kBytes;
  static constexpr int kQOffset = kVOffset + KTile::kBytes;
  static constexpr int kDoOffset = kQOffset + 2 * QTile::kBytes;
  static constexpr int kSOffset = kDoOffset + 2 * QTile::kBytes;
  static constexpr int kLseOffset = kSOffset + STile::kBytes;
  static constexpr int kDeltaOffset = kLseOffset + 2 * kBlockM * 4;
  static constexpr int kSmemBytes = kDeltaOffset + 2 * kBlockM * 4;
};
using BackwardD64 = BackwardTraits<64, 64, 128, 8>;
using BackwardD128 = BackwardTraits<128, 64, 128, 8>;

// `head`: the query head whose partial dK, dV go to the workspace (p.dk_accum set), else the
// key/value head whose group's query heads the CTA walks in turn.
template <class T, Elem E>
TESSEL_DEVICE void flash_backward_dkdv_cta(const FlashParams& p, int n_block, int head, int b,
                                           char* smem) {
  constexpr int kD = T::kHeadDim, kBM = T::kBlockM, kBN = T::kBlockN;
  constexpr int kNT = T::kNT, kDT = T::kDT;
  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const bool partial = p.dk_accum != nullptr;
  const int group = p.q_heads / p.kv_heads;
  const int hk = partial ? head / group : head;
  const int first_head = partial ? head : head * group, heads = partial ? 1 : group;
  const int j0 = n_block * kBN, keys = imin(kBN, p.kv_len - j0);
  const int warp_key0 = warp * 16;

  // Shared memory; the query-side buffers by index (0 or 1), computed rather than indexed so
  // that nothing lands in local memory.
  const SmemAddr base = smem_address(smem);
  const typename T::KTile sk{base + T::kKOffset}, sv{base + T::kVOffset};
  const typename T::STile sds{base + T::kSOffset};
  auto sq = [&](int buf) { return typename T::QTile{base + T::kQOffset + buf * T::QTile::kBytes}; };
  auto sdo = [&](int buf) {
    return typename T::QTile{base + T::kDoOffset + buf * T::QTile::kBytes};
  };
  auto slse = [&](int buf) { return base + T::kLseOffset + buf * kBM * 4; };
  auto sdelta = [&](int buf) { return base + T::kDeltaOffset + buf * kBM * 4; };

  // The work: query blocks [m_lo, m_hi) of each of the CTA's query heads, empty ones skipped.
  int m_lo, m_hi;
  query_block_range(p.mask, p.q_len, kBM, j0, j0 + keys, &m_lo, &m_hi);
  const int blocks = m_hi - m_lo, items = blocks > 0 ? heads * blocks : 0;
  auto head_of = [&](int item) { return first_head + item / blocks; };
  auto row_of = [&](int item) { return (m_lo + item % blocks) * kBM; };
  auto classify = [&](int item) {
    const int i0 = row_of(item), i1 = imin(i0 + kBM, p.q_len);
    BlockClass c = block_class(p.mask, b, head_of(item), i0, i1, j0, j0 + keys);
    if (c == BlockClass::kFull && (i1 - i0 < kBM || keys < kBN)) c = BlockClass::kMasked;
    return c;
  };
  auto next_item = [&](int item) {
    while (item < items && classify(item) == BlockClass::kSkip) ++item;
    return item;
  };
  auto load_item = [&](int item, int buf) {
    const int h = head_of(item), i0 = row_of(item), rows = imin(kBM, p.q_len - i0);
    load_tile<T::kThreads>(sq(buf), static_cast<const uint16_t*>(p.q.data) + p.q.offset(b, h, i0),
                           p.q.stride_s, rows, p.head_dim, tid);
    load_tile<T::kThreads>(sdo(buf),
                           static_cast<const uint16_t*>(p.dout.data) + p.dout.offset(b, h, i0),
                           p.dout.stride_s, rows, p.head_dim, tid);
    const int64_t row0 = (static_cast<int64_t>(b) * p.q_heads + h) * p.q_len + i0;
    if (tid < kBM) {
      cp_async_4(slse(buf) + 4 * tid, p.lse + row0 + (tid < rows ? tid : 0), tid < rows);
    } else if (tid < 2 * kBM) {
      const int r = tid - kBM;
      cp_async_4(sdelta(buf) + 4 * r, p.delta + row0 + (r < rows ? r : 0), r < rows);
    }
  };

  load_tile<T::kThreads>(sk, static_cast<const uint16_t*>(p.k.data) + p.k.offset(b, hk, j0),
                         p.k.stride_s, keys, p.head_dim, tid);
  load_tile<T::kThreads>(sv, static_cast<const uint16_t*>(p.v.data) + p.v.offset(b, hk, j0),
                         p.v.stride_s, keys, p.head_dim, tid);
  int item = next_item(0);
  if (item < items) load_item(item, 0);
  cp_async_commit();

  float dk[1][kDT][4], dv[1][kDT][4];
  TESSEL_UNROLL
  for (int dt = 0; dt < kDT; ++dt) {
    TESSEL_UNROLL
    for (int c = 0; c < 4; ++c) dk[0][dt][c] = dv[0][dt][c] = 0;
  }

  int buf = 0;
  while (item < items) {
    // 1. Prefetch the next query block into the other buffer.
    const int next = next_item(item + 1);
    if (next < items) load_item(next, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    cta_sync();

    const int h = head_of(item), i0 = row_of(item);
    const BlockClass cls = classify(item);
    const typename T::QTile q_tile = sq(buf), do_tile = sdo(buf);
    const SmemAddr lse_row = slse(buf), delta_row = sdelta(buf);
    const int row0 = j0 + warp_key0 + g, col0 = i0 + 2 * t;  // rows keys, columns queries
    const bool tile_masked = cls == BlockClass::kMasked && p.mask.tiles != nullptr;
    ElementBits<1, kNT> visible, kept;
    if (tile_masked) visible = visible_bits<true, 1, kNT>(p, b, h, row0, col0);
    if (p.dropout.threshold != 0) kept = dropout_bits<true, 1, kNT>(p.dropout, b, h, row0, col0);

    // 2. S^T = K Q^T, masked; P^T = exp2(S^T scale log2(e) - lse log2(e)).
    float st[1][kNT][4];
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) st[0][nt][0] = st[0][nt][1] = st[0][nt][2] = st[0][nt][3] = 0;
    gemm_a_bt<E, 1, kNT, kD>(st, sk, warp_key0, q_tile, 0, lane);
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) st[0][nt][c] *= p.scale_log2;
    }
    if (tile_masked) {
      mask_bits(st, visible);
    } else if (cls == BlockClass::kMasked) {
      mask_window<true>(st, p, row0, col0);
    }
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) {
        const float l = lse_log2(ld_shared_f32(lse_row + 4 * (nt * 8 + 2 * t + (c % 2))));
        st[0][nt][c] = exp2_fast(st[0][nt][c] - l);
      }
    }

    // 3. dP^T = V dO^T (the gradient of the dropped-out P); dS^T = P^T (dP^T - delta).
    float ds[1][kNT][4];
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) ds[0][nt][0] = ds[0][nt][1] = ds[0][nt][2] = ds[0][nt][3] = 0;
    gemm_a_bt<E, 1, kNT, kD>(ds, sv, warp_key0, do_tile, 0, lane);
    if (p.dropout.threshold != 0) apply_dropout(ds, kept, p.dropout.keep_scale);
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) {
        const float delta = ld_shared_f32(delta_row + 4 * (nt * 8 + 2 * t + (c % 2)));
        ds[0][nt][c] = st[0][nt][c] * (ds[0][nt][c] - delta);
      }
    }

    // 4. dV += P_dropped^T dO; dK += dS^T Q (scaled at the end).
    if (p.dropout.threshold != 0) apply_dropout(st, kept, p.dropout.keep_scale);
    gemm_p_b<E, 1, kDT, kBM>(dv, st, do_tile, 0, 0, lane);
    gemm_p_b<E, 1, kDT, kBM>(dk, ds, q_tile, 0, 0, lane);

    // 5. dQ += dS K through shared memory and f32 atomics (unless a dQ kernel follows).
    if (p.dq_accum != nullptr) {
      accumulators_to_tile<E>(ds, 1.0f, sds, warp_key0, 0, lane);
      cta_sync();
      const int qm = (warp % T::kDqWarpsM) * 16, dc = (warp / T::kDqWarpsM) * (kD / T::kDqWarpsD);
      float dq[1][T::kDqNT][4];
      TESSEL_UNROLL
      for (int nt = 0; nt < T::kDqNT; ++nt)
        dq[0][nt][0] = dq[0][nt][1] = dq[0][nt][2] = dq[0][nt][3] = 0;
      gemm_at_b<E, 1, T::kDqNT, kBN>(dq, sds, qm, sk, dc, 0, lane);
      float* acc = p.dq_accum + ((static_cast<int64_t>(b) * p.q_heads + h) * p.q_len) * kD;
      TESSEL_UNROLL
      for (int nt = 0; nt < T::kDqNT; ++nt) {
        TESSEL_UNROLL
        for (int c = 0; c < 4; ++c) {
          const int i = i0 + qm + g + 8 * (c / 2), d = dc + nt * 8 + 2 * t + (c % 2);
          if (i < p.q_len && d < p.head_dim)
            atomic_add_f32(acc + static_cast<int64_t>(i) * kD + d, dq[0][nt][c]);
        }
      }
    }
    cta_sync();  // every warp is done with this buffer and with sds
    buf ^= 1;
    item = next;
  }
  cp_async_wait<0>();
  cta_sync();

  if (partial) {
    // Epilogue under GQA: this query head's partial dK (times the softmax scale) and dV, in
    // f32 straight from the accumulators to the workspace, for kernel 5 to sum.
    const int64_t row0 = (static_cast<int64_t>(b) * p.q_heads + head) * p.kv_len;
    TESSEL_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int j = j0 + warp_key0 + g + 8 * r;
      if (j >= p.kv_len) continue;
      float* dk_row = p.dk_accum + (row0 + j) * kD;
      float* dv_row = p.dv_accum + (row0 + j) * kD;
      TESSEL_UNROLL
      for (int dt = 0; dt < kDT; ++dt) {
        const int d = dt * 8 + 2 * t;
        dk_row[d] = dk[0][dt][2 * r] * p.scale;
        dk_row[d + 1] = dk[0][dt][2 * r + 1] * p.scale;
        dv_row[d] = dv[0][dt][2 * r];
        dv_row[d + 1] = dv[0][dt][2 * r + 1];
      }
    }
    return;
  }

  // Epilogue: dK (times the softmax scale) and dV through shared memory.
  accumulators_to_tile<E>(dk, p.scale, sk, warp_key0, 0, lane);
  accumulators_to_tile<E>(dv, 1.0f, sv, warp_key0, 0, lane);
  cta_sync();
  store_tile<T::kThreads>(sk, static_cast<uint16_t*>(p.dk.data) + p.dk.offset(b, hk, j0),
                          p.dk.stride_s, keys, p.head_dim, tid);
  store_tile<T::kThreads>(sv, static_cast<uint16_t*>(p.dv.data) + p.dv.offset(b, hk, j0),
                          p.dv.stride_s, keys, p.head_dim, tid);
}

// ---- 3. dQ alone (the deterministic backward) --------------------------------------------

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per step
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static_assert(kBlockM == 16 * kWarps, "one m-tile of 16 queries per warp");
  static constexpr int kNT = kBlockN / 8;
  static constexpr int kDT = kHeadDim / 8;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KTile = SmemTile<kBlockN, kHeadDim>;
  // Shared memory: Q, dO, then K[2], V[2].
  static constexpr int kDoOffset = QTile::kBytes;
  static constexpr int kKOffset = 2 * QTile::kBytes;
  static constexpr int kVOffset = kKOffset + 2 * KTile::kBytes;
  static constexpr int kSmemBytes = kVOffset + 2 * KTile::kBytes;
};
using DqD64 = DqTraits<64, 64, 64, 4>;
using DqD128 = DqTraits<128, 64, 64, 4>;

template <class T, Elem E>
TESSEL_DEVICE void flash_backward_dq_cta(const FlashParams& p, int m_block, int h, int b,
                                         char* smem) {
  constexpr int kD = T::kHeadDim, kBM = T::kBlockM, kBN = T::kBlockN;
  constexpr int kNT = T::kNT, kDT = T::kDT;
  const int tid = thread_index(), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int hk = h / (p.q_heads / p.kv_heads);
  const int i0 = m_block * kBM, rows = imin(kBM, p.q_len - i0);
  const int warp_row0 = warp * 16;

  const SmemAddr base = smem_address(smem);
  const typename T::QTile sq{base}, sdo{base + T::kDoOffset};
  auto sk = [&](int buf) { return typename T::KTile{base + T::kKOffset + buf * T::KTile::kBytes}; };
  auto sv = [&](int buf) { return typename T::KTile{base + T::kVOffset + buf * T::KTile::kBytes}; };
  const uint16_t* k = static_cast<const uint16_t*>(p.k.data) + p.k.offset(b, hk, 0);
  const uint16_t* v = static_cast<const uint16_t*>(p.v.data) + p.v.offset(b, hk, 0);

  int n_lo, n_hi;
  key_block_range(p.mask, p.kv_len, kBN, i0, i0 + rows, &n_lo, &n_hi);
  auto classify = [&](int n) {
    const int j0 = n * kBN, j1 = imin(j0 + kBN, p.kv_len);
    BlockClass c = block_class(p.mask, b, h, i0, i0 + rows, j0, j1);
    if (c == BlockClass::kFull && (j1 - j0 < kBN || rows < kBM)) c = BlockClass::kMasked;
    return c;
  };
  auto next_block = [&](int n) {
    while (n < n_hi && classify(n) == BlockClass::kSkip) ++n;
    return n;
  };
  auto load_keys = [&](int n, int buf) {
    const int j0 = n * kBN, keys = imin(kBN, p.kv_len - j0);
    load_tile<T::kThreads>(sk(buf), k + j0 * p.k.stride_s, p.k.stride_s, keys, p.head_dim, tid);
    load_tile<T::kThreads>(sv(buf), v + j0 * p.v.stride_s, p.v.stride_s, keys, p.head_dim, tid);
  };

  load_tile<T::kThreads>(sq, static_cast<const uint16_t*>(p.q.data) + p.q.offset(b, h, i0),
                         p.q.stride_s, rows, p.head_dim, tid);
  load_tile<T::kThreads>(sdo, static_cast<const uint16_t*>(p.dout.data) + p.dout.offset(b, h, i0),
                         p.dout.stride_s, rows, p.head_dim, tid);
  int n = next_block(n_lo);
  if (n < n_hi) load_keys(n, 0);
  cp_async_commit();

  // The logsumexp and delta of the thread's two rows.
  float lse[2], delta[2];
  TESSEL_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + warp_row0 + g + 8 * r;
    const int64_t row = (static_cast<int64_t>(b) * p.q_heads + h) * p.q_len + i;
    lse[r] = i < p.q_len ? lse_log2(p.lse[row]) : INFINITY;
    delta[r] = i < p.q_len ? p.delta[row] : 0.0f;
  }

  float dq[1][kDT][4];
  TESSEL_UNROLL
  for (int dt = 0; dt < kDT; ++dt) dq[0][dt][0] = dq[0][dt][1] = dq[0][dt][2] = dq[0][dt][3] = 0;

  int buf = 0;
  while (n < n_hi) {
    const int next = next_block(n + 1);
    if (next < n_hi) load_keys(next, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    cta_sync();

    const int j0 = n * kBN;
    const BlockClass cls = classify(n);
    const typename T::KTile k_tile = sk(buf), v_tile = sv(buf);
    const int row0 = i0 + warp_row0 + g, col0 = j0 + 2 * t;
    const bool tile_masked = cls == BlockClass::kMasked && p.mask.tiles != nullptr;
    ElementBits<1, kNT> visible, kept;
    if (tile_masked) visible = visible_bits<false, 1, kNT>(p, b, h, row0, col0);
    if (p.dropout.threshold != 0) kept = dropout_bits<false, 1, kNT>(p.dropout, b, h, row0, col0);

    // P = exp2(S scale log2(e) - lse), masked.
    float s[1][kNT][4];
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) s[0][nt][0] = s[0][nt][1] = s[0][nt][2] = s[0][nt][3] = 0;
    gemm_a_bt<E, 1, kNT, kD>(s, sq, warp_row0, k_tile, 0, lane);
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) s[0][nt][c] *= p.scale_log2;
    }
    if (tile_masked) {
      mask_bits(s, visible);
    } else if (cls == BlockClass::kMasked) {
      mask_window<false>(s, p, row0, col0);
    }
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) s[0][nt][c] = exp2_fast(s[0][nt][c] - lse[c / 2]);
    }

    // dS = P (dP - delta) with dP = dO V^T (through dropout); dQ += dS K.
    float ds[1][kNT][4];
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) ds[0][nt][0] = ds[0][nt][1] = ds[0][nt][2] = ds[0][nt][3] = 0;
    gemm_a_bt<E, 1, kNT, kD>(ds, sdo, warp_row0, v_tile, 0, lane);
    if (p.dropout.threshold != 0) apply_dropout(ds, kept, p.dropout.keep_scale);
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) ds[0][nt][c] = s[0][nt][c] * (ds[0][nt][c] - delta[c / 2]);
    }
    gemm_p_b<E, 1, kDT, kBN>(dq, ds, k_tile, 0, 0, lane);
    cta_sync();  // every warp is done with this buffer
    buf ^= 1;
    n = next;
  }
  cp_async_wait<0>();
  cta_sync();

  accumulators_to_tile<E>(dq, p.scale, sq, warp_row0, 0, lane);
  cta_sync();
  store_tile<T::kThreads>(sq, static_cast<uint16_t*>(p.dq.data) + p.dq.offset(b, h, i0),
                          p.dq.stride_s, rows, p.head_dim, tid);
}

// ---- Launch shapes (shared with the emulator) --------------------------------------------

struct BackwardLaunch {
  int rows_grid;         // preprocess / postprocess CTAs (RowChunks::kThreads threads)
  int dkdv_grid[3];      // (key blocks, H_q with a dK/dV workspace else H_kv, B)
  int dq_grid[3];        // (query blocks, H_q, B)
  int reduce_rows_grid;  // GQA's dK/dV sums (RowChunks::kThreads threads); 0 without
};
template <class T, class Q, int kD>
inline BackwardLaunch backward_launch_shape(const FlashParams& p) {
  constexpr int kRows = RowChunks<kD>::kRows;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_heads * p.q_len;
  const int64_t key_rows = static_cast<int64_t>(p.batch) * p.kv_heads * p.kv_len;
  const bool partial = p.dk_accum != nullptr;
  return {static_cast<int>((rows + kRows - 1) / kRows),
          {(p.kv_len + T::kBlockN - 1) / T::kBlockN, partial ? p.q_heads : p.kv_heads, p.batch},
          {(p.q_len + Q::kBlockM - 1) / Q::kBlockM, p.q_heads, p.batch},
          partial ? static_cast<int>((key_rows + kRows - 1) / kRows) : 0};
}

}  // namespace tessel::kernels::attention::cuda

#if defined(__CUDACC__)

#include "tessel/kernels/attention/cuda/internal/flash_launch.h"
#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel::kernels::attention::cuda {

template <int kD, Elem E>
__global__ void __launch_bounds__(RowChunks<kD>::kThreads)
    backward_preprocess_kernel(const FlashParams p) {
  backward_preprocess_cta<kD, E>(p, blockIdx.x);
}

template <int kD, Elem E>
__global__ void __launch_bounds__(RowChunks<kD>::kThreads)
    backward_postprocess_kernel(const FlashParams p) {
  backward_postprocess_cta<kD, E>(p, blockIdx.x);
}

template <int kD, Elem E>
__global__ void __launch_bounds__(RowChunks<kD>::kThreads)
    backward_reduce_dkdv_kernel(const FlashParams p) {
  backward_reduce_dkdv_cta<kD, E>(p, blockIdx.x);
}

template <class T, Elem E>
__global__ void __launch_bounds__(T::kThreads) flash_backward_dkdv_kernel(const FlashParams p) {
  extern __shared__ __align__(1024) char smem[];
  flash_backward_dkdv_cta<T, E>(p, blockIdx.x, blockIdx.y, blockIdx.z, smem);
}

template <class T, Elem E>
__global__ void __launch_bounds__(T::kThreads, 1) flash_backward_dq_kernel(const FlashParams p) {
  extern __shared__ __align__(1024) char smem[];
  // The last query blocks first (under a causal mask they see the most keys).
  flash_backward_dq_cta<T, E>(p, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z, smem);
}

template <class T, class Q, int kD, Elem E>
void launch_backward(const FlashParams& p, cudaStream_t stream) {
  const BackwardLaunch s = backward_launch_shape<T, Q, kD>(p);
  const int device = ::tessel::cuda::current_device();
  constexpr int kRowThreads = RowChunks<kD>::kThreads;
  if (p.q_len > 0) {
    backward_preprocess_kernel<kD, E><<<s.rows_grid, kRowThreads, 0, stream>>>(p);
    ::tessel::cuda::check_launch("backward_preprocess_kernel", device);
  }
  if (p.kv_len > 0) {
    auto dkdv = flash_backward_dkdv_kernel<T, E>;
    allow_dynamic_smem(reinterpret_cast<const void*>(dkdv), T::kSmemBytes);
    dkdv<<<dim3(s.dkdv_grid[0], s.dkdv_grid[1], s.dkdv_grid[2]), T::kThreads, T::kSmemBytes,
           stream>>>(p);
    ::tessel::cuda::check_launch("flash_backward_dkdv_kernel", device);
    if (s.reduce_rows_grid > 0) {
      backward_reduce_dkdv_kernel<kD, E><<<s.reduce_rows_grid, kRowThreads, 0, stream>>>(p);
      ::tessel::cuda::check_launch("backward_reduce_dkdv_kernel", device);
    }
  }
  if (p.q_len == 0) return;
  if (p.dq_accum != nullptr) {
    backward_postprocess_kernel<kD, E><<<s.rows_grid, kRowThreads, 0, stream>>>(p);
    ::tessel::cuda::check_launch("backward_postprocess_kernel", device);
  } else {
    auto dq = flash_backward_dq_kernel<Q, E>;
    allow_dynamic_smem(reinterpret_cast<const void*>(dq), Q::kSmemBytes);
    dq<<<dim3(s.dq_grid[0], s.dq_grid[1], s.dq_grid[2]), Q::kThreads, Q::kSmemBytes, stream>>>(p);
    ::tessel::cuda::check_launch("flash_backward_dq_kernel", device);
  }
}

void launch_flash_backward(const FlashParams& p, Elem elem, int kernel_head_dim,
                           cudaStream_t stream) {
  if (p.batch == 0 || p.q_heads == 0) return;
  const bool bf16 = elem == Elem::kBf16;
  if (kernel_head_dim == 64) {
    bf16 ? launch_backward<BackwardD64, DqD64, 64, Elem::kBf16>(p, stream)
         : launch_backward<BackwardD64, DqD64, 64, Elem::kF16>(p, stream);
  } else {
    bf16 ? launch_backward<BackwardD128, DqD128, 128, Elem::kBf16>(p, stream)
         : launch_backward<BackwardD128, DqD128, 128, Elem::kF16>(p, stream);
  }
}

}  // namespace tessel::kernels::attention::cuda

#endif  // __CUDACC__
