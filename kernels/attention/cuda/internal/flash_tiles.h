#pragma once
// Tile-level building blocks of the CUDA attention kernels: global <-> shared copies of
// (rows x head dim) tiles and the three warp GEMM shapes the algorithms need, on m16n8k16
// tensor-core products with f32 accumulators. A warp owns kMT m-tiles of 16 rows; accumulators
// are float[kMT][kNT][4] in the C layout of warp_primitives.h (n-tile nt covers columns
// 8 nt .. 8 nt + 7).

#include <cmath>
#include <cstdint>

#include "tessel/kernels/attention/cuda/internal/flash_params.h"

#if defined(__CUDACC__)
#define TESSEL_UNROLL _Pragma("unroll")
#define TESSEL_NO_UNROLL _Pragma("unroll 1")
#else
#define TESSEL_UNROLL
#define TESSEL_NO_UNROLL
#endif

namespace tessel::kernels::attention::cuda {

TESSEL_HD int imin(int a, int b) { return a < b ? a : b; }

// Issues cp.async for rows [0, rows) x columns [0, cols) of a tile from global memory (element
// stride between rows, columns contiguous, cols a multiple of 8); the rest of the tile is
// zero-filled. Every thread of the CTA calls it. A thread copies one 16-byte column chunk of
// every (kThreads / chunks per row)-th row, so its shared address only moves by whole rows.
template <int kThreads, int kRows, int kCols>
TESSEL_DEVICE void load_tile(const SmemTile<kRows, kCols>& tile, const uint16_t* src,
                             int64_t row_stride, int rows, int cols, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowStep == 0 && kRowStep % 8 == 0,
                "tile rows must divide among the threads in steps of 8 rows");
  const int r0 = tid / kChunksPerRow, c = (tid % kChunksPerRow) * 8;
  const SmemAddr dst = tile.at(r0, c);
  const uint16_t* from = src + r0 * row_stride + c;
  const bool col_ok = c < cols;
  TESSEL_UNROLL
  for (int it = 0; it < kRows / kRowStep; ++it) {
    const bool ok = col_ok && r0 + it * kRowStep < rows;
    cp_async_16(dst + it * kRowStep * SmemTile<kRows, kCols>::kRowBytes,
                ok ? from + it * kRowStep * row_stride : src, ok);
  }
}

// Stores rows [0, rows) x columns [0, cols) of a tile to global memory, 16 bytes at a time.
template <int kThreads, int kRows, int kCols>
TESSEL_DEVICE void store_tile(const SmemTile<kRows, kCols>& tile, uint16_t* dst, int64_t row_stride,
                              int rows, int cols, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowStep == 0 && kRowStep % 8 == 0,
                "tile rows must divide among the threads in steps of 8 rows");
  const int r0 = tid / kChunksPerRow, c = (tid % kChunksPerRow) * 8;
  const SmemAddr from = tile.at(r0, c);
  TESSEL_UNROLL
  for (int it = 0; it < kRows / kRowStep; ++it) {
    if (c < cols && r0 + it * kRowStep < rows) {
      copy16_to_global(dst + (r0 + it * kRowStep) * row_stride + c,
                       from + it * kRowStep * SmemTile<kRows, kCols>::kRowBytes);
    }
  }
}

// Writes a warp's accumulator rows into a tile as 16-bit pairs, times `scale`: m-tile mt holds
// tile rows row0 + 16 mt .. + 15, n-tile nt tile columns col0 + 8 nt .. + 7.
template <Elem E, int kMT, int kNT, int kRows, int kCols>
TESSEL_DEVICE void accumulators_to_tile(const float (&acc)[kMT][kNT][4], float scale,
                                        const SmemTile<kRows, kCols>& tile, int row0, int col0,
                                        int lane) {
  const int g = lane / 4, t = lane % 4;
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      const int r = row0 + mt * 16 + g, c = col0 + nt * 8 + 2 * t;
      st_shared_u32(tile.at(r, c), pack2<E>(acc[mt][nt][0] * scale, acc[mt][nt][1] * scale));
      st_shared_u32(tile.at(r + 8, c), pack2<E>(acc[mt][nt][2] * scale, acc[mt][nt][3] * scale));
    }
  }
}

// acc[mt][2 nj], acc[mt][2 nj + 1] += af[mt] times the two n-tiles of B in bf (an
// ldmatrix_x4 of a 16 x 16 block of B).
template <Elem E, int kMT, int kNT, int kMA>
TESSEL_DEVICE void mma_n_pair(float (&acc)[kMT][kNT][4], int nj, const uint32_t (&af)[kMA][4],
                              const uint32_t (&bf)[4]) {
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    mma_16816<E>(acc[mt][2 * nj], af[mt], bf[0], bf[1]);
    mma_16816<E>(acc[mt][2 * nj + 1], af[mt], bf[2], bf[3]);
  }
}

// acc += A B^T with A rows a_row0 + 16 mt .. of tile `a` and B^T from tile `bt` stored as rows
// n (bt_row0 + 8 nt ..) x columns k: both operands row-major in k, as Q and K are for S = Q K^T.
// kK is the shared (k) extent, a multiple of 16; kNT is even.
template <Elem E, int kMT, int kNT, int kK, int kRa, int kCa, int kRb, int kCb>
TESSEL_DEVICE void gemm_a_bt(float (&acc)[kMT][kNT][4], const SmemTile<kRa, kCa>& a, int a_row0,
                             const SmemTile<kRb, kCb>& bt, int bt_row0, int lane) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "gemm_a_bt shape");
  using TA = SmemTile<kRa, kCa>;
  using TB = SmemTile<kRb, kCb>;
  // Matrix q = lane / 8 of an A fragment: rows 8 (q % 2) .., columns 8 (q / 2) ..; of a B
  // fragment pair: rows (n) 8 (q / 2) .., columns (k) 8 (q % 2) ...
  const SmemAddr a0 = a.at(a_row0 + lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8);
  const SmemAddr b0 = bt.at(bt_row0 + lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8);
  TESSEL_UNROLL
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[kMT][4];
    TESSEL_UNROLL
    for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(af[mt], TA::step(a0, mt * 16, kk));
    TESSEL_UNROLL
    for (int nj = 0; nj < kNT / 2; ++nj) {
      uint32_t bf[4];
      ldmatrix_x4(bf, TB::step(b0, nj * 16, kk));
      mma_n_pair<E>(acc, nj, af, bf);
    }
  }
}

// acc += P B with P in registers (a warp's accumulators of a previous product: kMT m-tiles x
// kK columns, rounded to 16 bits here) and B from tile `b` stored as rows k (b_row0 + ..) x
// columns n (b_col0 + 8 nt ..), as V is for O = P V.
template <Elem E, int kMT, int kNT, int kK, int kRb, int kCb>
TESSEL_DEVICE void gemm_p_b(float (&acc)[kMT][kNT][4], const float (&p)[kMT][kK / 8][4],
                            const SmemTile<kRb, kCb>& b, int b_row0, int b_col0, int lane) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "gemm_p_b shape");
  using TB = SmemTile<kRb, kCb>;
  // Matrix q: rows (k) 8 (q % 2) .., columns (n) 8 (q / 2) ..; transposed on load.
  const SmemAddr b0 = b.at(b_row0 + lane % 8 + ((lane / 8) % 2) * 8, b_col0 + (lane / 16) * 8);
  TESSEL_UNROLL
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[kMT][4];
    TESSEL_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      af[mt][0] = pack2<E>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      af[mt][1] = pack2<E>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      af[mt][2] = pack2<E>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      af[mt][3] = pack2<E>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
    TESSEL_UNROLL
    for (int nj = 0; nj < kNT / 2; ++nj) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, TB::step(b0, kk * 16, nj));
      mma_n_pair<E>(acc, nj, af, bf);
    }
  }
}

// acc += A^T B with A^T from tile `at` stored as rows k x columns m (at_col0 + 16 mt ..) and B
// from tile `b` stored as rows k x columns n (b_col0 + 8 nt ..); k runs over rows
// [k_row0, k_row0 + kK) of both. (The backward's dQ = dS K with dS^T and K in shared memory.)
template <Elem E, int kMT, int kNT, int kK, int kRa, int kCa, int kRb, int kCb>
TESSEL_DEVICE void gemm_at_b(float (&acc)[kMT][kNT][4], const SmemTile<kRa, kCa>& at, int at_col0,
                             const SmemTile<kRb, kCb>& b, int b_col0, int k_row0, int lane) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0 && kMT == 1, "gemm_at_b shape");
  using TA = SmemTile<kRa, kCa>;
  using TB = SmemTile<kRb, kCb>;
  // A^T's matrix q: k rows 8 (q / 2) .., m columns 8 (q % 2) ..; B's: k rows 8 (q % 2) ..,
  // n columns 8 (q / 2) ..; both transposed on load.
  const SmemAddr a0 = at.at(k_row0 + (lane / 16) * 8 + lane % 8, at_col0 + ((lane / 8) % 2) * 8);
  const SmemAddr b0 = b.at(k_row0 + lane % 8 + ((lane / 8) % 2) * 8, b_col0 + (lane / 16) * 8);
  TESSEL_UNROLL
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t af[1][4];
    ldmatrix_x4_trans(af[0], TA::step(a0, kk * 16, 0));
    TESSEL_UNROLL
    for (int nj = 0; nj < kNT / 2; ++nj) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, TB::step(b0, kk * 16, nj));
      mma_n_pair<E>(acc, nj, af, bf);
    }
  }
}

// ---- Masks and dropout on a warp's accumulators --------------------------------------------
//
// A thread's accumulator element (mt, nt, c) sits at row row0 + 16 mt + 8 (c / 2) and column
// col0 + 8 nt + (c % 2) of the block, with row0 = first row + lane / 4 and col0 = first column
// + 2 (lane % 4). Rows are queries and columns keys, or — kTransposed, the backward's S^T —
// rows keys and columns queries. Per-element predicates that cost more than a comparison (tile
// lookups, document ids, Philox) are evaluated in a loop that is not unrolled and collected as
// bits, so the accumulators stay in registers and the code stays small.

template <int kMT, int kNT>
struct ElementBits {
  static constexpr int kWords = kMT * kNT * 4 / 32;
  static_assert(kMT * kNT * 4 % 32 == 0, "whole words of bits");
  uint32_t w[kWords] = {};
};

template <bool kTransposed, int kNT>
TESSEL_DEVICE void element_position(int idx, int row0, int col0, int* i, int* j) {
  const int mt = idx / (kNT * 4), nt = (idx / 4) % kNT, c = idx % 4;
  const int row = row0 + mt * 16 + 8 * (c / 2), col = col0 + nt * 8 + (c % 2);
  *i = kTransposed ? col : row;
  *j = kTransposed ? row : col;
}

// Sets the scores a window mask hides to -inf (the whole mask when there is no tile map), and
// those of queries >= S_q or keys >= S_k. Each row sees one range of columns [lo, hi).
template <bool kTransposed, int kMT, int kNT>
TESSEL_DEVICE void mask_window(float (&s)[kMT][kNT][4], const FlashParams& p, int row0, int col0) {
  const MaskParams& m = p.mask;
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    TESSEL_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + mt * 16 + 8 * r;
      int lo, hi;
      if (!kTransposed) {  // row = query i; visible keys j: p - left <= j <= p + right
        const int pos = row + m.shift;
        lo = m.left < 0 ? 0 : pos - m.left;
        hi = m.right < 0 ? p.kv_len : imin(p.kv_len, pos + m.right + 1);
      } else {  // row = key j; visible queries i: j - right - shift <= i <= j + left - shift
        lo = m.right < 0 ? 0 : row - m.right - m.shift;
        hi = m.left < 0 ? p.q_len : imin(p.q_len, row + m.left - m.shift + 1);
        if (row >= p.kv_len) hi = lo;
      }
      TESSEL_UNROLL
      for (int nt = 0; nt < kNT; ++nt) {
        TESSEL_UNROLL
        for (int c = 2 * r; c < 2 * r + 2; ++c) {
          const int col = col0 + nt * 8 + (c % 2);
          if (col < lo || col >= hi) s[mt][nt][c] = -INFINITY;
        }
      }
    }
  }
}

// The visible elements of the warp's block under a tile map (bit set: visible; queries >= S_q
// and keys >= S_k are not). Evaluated before the block's product, while fewer registers live.
template <bool kTransposed, int kMT, int kNT>
TESSEL_DEVICE ElementBits<kMT, kNT> visible_bits(const FlashParams& p, int b, int h, int row0,
                                                 int col0) {
  ElementBits<kMT, kNT> bits;
  TESSEL_UNROLL
  for (int w = 0; w < bits.kWords; ++w) {
    uint32_t word = 0;
    TESSEL_NO_UNROLL
    for (int e = 0; e < 32; ++e) {
      int i, j;
      element_position<kTransposed, kNT>(w * 32 + e, row0, col0, &i, &j);
      const bool vis = i < p.q_len && j < p.kv_len && visible(p.mask, b, h, i, j);
      word |= static_cast<uint32_t>(vis) << e;
    }
    bits.w[w] = word;
  }
  return bits;
}

// x = -inf where the bit is clear.
template <int kMT, int kNT>
TESSEL_DEVICE void mask_bits(float (&x)[kMT][kNT][4], const ElementBits<kMT, kNT>& bits) {
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) {
        const int idx = (mt * kNT + nt) * 4 + c;
        if (((bits.w[idx / 32] >> (idx % 32)) & 1u) == 0) x[mt][nt][c] = -INFINITY;
      }
    }
  }
}

// Dropout's keep decisions for the warp's elements (bit set: kept). A thread's elements of two
// adjacent n-tiles at one column parity — rows r and r + 8, columns c and c + 8 — are one
// dropout group (attention_dropout.h), rows being queries or (kTransposed) keys: one Philox call
// per four elements, FlashAttention-2's rate. Needs row0 % 16 < 8 and col0 % 16 < 8 (tiles at
// multiples of 16) and an even kNT.
template <bool kTransposed, int kMT, int kNT>
TESSEL_DEVICE ElementBits<kMT, kNT> dropout_bits(const DropoutParams& d, int b, int h, int row0,
                                                 int col0) {
  static_assert(kNT % 2 == 0, "dropout groups span two n-tiles");
  ElementBits<kMT, kNT> bits;
  TESSEL_UNROLL
  for (int w = 0; w < bits.kWords; ++w) {
    uint32_t word = 0;
    // A word holds 8 n-tiles' 4 elements: 4 n-tile pairs x 2 column parities = 8 groups. The
    // group's first element is (n-tile even, c = parity); +2 is row + 8, +4 the next n-tile
    // (column + 8), +6 both.
    TESSEL_NO_UNROLL
    for (int q = 0; q < 8; ++q) {
      const int e = (q / 2) * 8 + (q % 2);
      int i, j;
      element_position<kTransposed, kNT>(w * 32 + e, row0, col0, &i, &j);
      bool keep[4];  // (i, j), (i, j + 8), (i + 8, j), (i + 8, j + 8)
      dropout_keep4(d, b, h, i, j, keep);
      const bool row8 = kTransposed ? keep[1] : keep[2], col8 = kTransposed ? keep[2] : keep[1];
      word |= (static_cast<uint32_t>(keep[0]) << e) | (static_cast<uint32_t>(row8) << (e + 2)) |
              (static_cast<uint32_t>(col8) << (e + 4)) |
              (static_cast<uint32_t>(keep[3]) << (e + 6));
    }
    bits.w[w] = word;
  }
  return bits;
}

// x = kept ? x * keep_scale : 0 for every element.
template <int kMT, int kNT>
TESSEL_DEVICE void apply_dropout(float (&x)[kMT][kNT][4], const ElementBits<kMT, kNT>& bits,
                                 float keep_scale) {
  TESSEL_UNROLL
  for (int mt = 0; mt < kMT; ++mt) {
    TESSEL_UNROLL
    for (int nt = 0; nt < kNT; ++nt) {
      TESSEL_UNROLL
      for (int c = 0; c < 4; ++c) {
        const int idx = (mt * kNT + nt) * 4 + c;
        const bool kept = ((bits.w[idx / 32] >> (idx % 32)) & 1u) != 0;
        x[mt][nt][c] = kept ? x[mt][nt][c] * keep_scale : 0.0f;
      }
    }
  }
}

// Sums a row's partial value over the four threads of a quad (the threads holding one row).
TESSEL_DEVICE float quad_sum(float v) {
  v += shfl_xor(v, 1);
  v += shfl_xor(v, 2);
  return v;
}
TESSEL_DEVICE float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  v = fmaxf(v, shfl_xor(v, 2));
  return v;
}

}  // namespace tessel::kernels::attention::cuda
