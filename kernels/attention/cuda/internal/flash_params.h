#pragma once
// The arguments of the CUDA attention kernels: raw (B, H, S, D) views, the resolved mask and
// dropout, scratch pointers. One plain struct, passed by value as a kernel parameter; built on
// the host by flash_cuda_plan.cc, read on the device (and by the host emulation in tests).
//
// Also here: the mask and dropout predicates the kernels evaluate per element and per block,
// written once for the device and the host (TESSEL_HD).

#include <cstdint>

#include "tessel/kernels/attention/cuda/internal/warp_primitives.h"

namespace tessel::kernels::attention::cuda {

// A (B, H, S, D) view: element strides of b, h, s and d (the flash kernels need stride_d 1).
struct DeviceView {
  void* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_s = 0, stride_d = 1;

  TESSEL_HD int64_t offset(int64_t b, int64_t h, int64_t s) const {
    return b * stride_b + h * stride_h + s * stride_s;
  }
};

// The mask is resolved on the host into a tile map of 64 x 64 (query x key) tiles. Entries:
// kTileEmpty (nothing visible), kTileFull (everything), kTilePartial (evaluate the built-in
// parts per element on the device), or an index >= 0 of 64 words of per-element bits (a
// predicate evaluated on the host: word = query row in the tile, bit = key).
inline constexpr int kMaskTile = 64;
inline constexpr int32_t kTileEmpty = -1;
inline constexpr int32_t kTileFull = -2;
inline constexpr int32_t kTilePartial = -3;

struct MaskParams {
  int shift = 0;   // the aligned query position of row i is i + shift (bottom-right: S_k - S_q)
  int left = -1;   // keys before the aligned position a row sees; -1 unbounded
  int right = -1;  // keys after it (causal caps this at 0); -1 unbounded
  // Tile map: null unless the mask has prefix lengths, documents or a predicate. Indexed
  // (b, mask head, query tile, key tile); one mask head, or H_q with a predicate.
  const int32_t* tiles = nullptr;
  int tiles_q = 0, tiles_k = 0, heads = 1;
  const uint64_t* bits = nullptr;
  const int32_t* prefix = nullptr;  // prefix_count (0, 1 or B) prefix lengths
  int prefix_count = 0;
  const int32_t* q_docs = nullptr;  // document ids; null without documents
  const int32_t* kv_docs = nullptr;
  int64_t q_docs_stride = 0;  // per batch entry; 0 when every entry shares the ids
  int64_t kv_docs_stride = 0;
};

// Dropout as attention_dropout.h defines it: keep (b, h, i, j) when word
// 2 ((i / 8) % 2) + (j / 8) % 2 of philox4x32({g(j), g(i), (b << 16) ^ h, offset}, {key0, key1})
// >= threshold, g(x) = 8 (x / 16) + x % 8: one call per four elements.
struct DropoutParams {
  uint32_t threshold = 0;  // 0: no dropout
  float keep_scale = 1.0f;
  uint32_t key0 = 0, key1 = 0;
  uint32_t offset = 0;
};

struct FlashParams {
  DeviceView q, k, v, out;      // q, out (B, H_q, S_q, D); k, v (B, H_kv, S_k, D)
  DeviceView dout, dq, dk, dv;  // backward only
  float* lse = nullptr;         // (B, H_q, S_q) contiguous, natural log
  float* delta = nullptr;       // backward scratch: rowsum(dO * O), (B, H_q, S_q)
  float* dq_accum = nullptr;    // backward scratch: f32 (B, H_q, S_q, kernel head dim); null
                                // in the deterministic backward (dQ by its own kernel)
  float* dk_accum = nullptr;    // backward scratch under GQA/MQA: f32 (B, H_q, S_k, kernel head
  float* dv_accum = nullptr;    // dim) partial dK, dV per query head, summed over each group
                                // afterwards; null: one CTA per key/value head writes dK, dV
  int batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0;
  int head_dim = 0;                        // D of the views (<= the kernel's head dim; zero-padded)
  float scale = 1.0f;                      // softmax scale
  float scale_log2 = 1.4426950408889634f;  // scale * log2(e)
  MaskParams mask;
  DropoutParams dropout;
};

// ---- Mask predicates ---------------------------------------------------------------------

TESSEL_HD bool window_visible(const MaskParams& m, int i, int j) {
  const int p = i + m.shift;
  return (m.left < 0 || p - j <= m.left) && (m.right < 0 || j - p <= m.right);
}

// The built-in parts: (window || prefix) && same document.
TESSEL_HD bool builtin_visible(const MaskParams& m, int b, int i, int j) {
  bool ok = window_visible(m, i, j);
  if (!ok && m.prefix_count > 0) ok = j < m.prefix[m.prefix_count == 1 ? 0 : b];
  if (ok && m.q_docs != nullptr) {
    ok = m.q_docs[b * m.q_docs_stride + i] == m.kv_docs[b * m.kv_docs_stride + j];
  }
  return ok;
}

TESSEL_HD int32_t tile_entry(const MaskParams& m, int b, int h, int tile_i, int tile_j) {
  const int hm = m.heads == 1 ? 0 : h;
  return m
      .tiles[((static_cast<int64_t>(b) * m.heads + hm) * m.tiles_q + tile_i) * m.tiles_k + tile_j];
}

// True when query i of (b, h) sees key j; requires i < S_q and j < S_k.
TESSEL_HD bool visible(const MaskParams& m, int b, int h, int i, int j) {
  if (m.tiles == nullptr) return window_visible(m, i, j);
  const int32_t t = tile_entry(m, b, h, i / kMaskTile, j / kMaskTile);
  if (t == kTileFull) return true;
  if (t == kTileEmpty) return false;
  if (t == kTilePartial) return builtin_visible(m, b, i, j);
  return ((m.bits[static_cast<int64_t>(t) * kMaskTile + i % kMaskTile] >> (j % kMaskTile)) & 1u) !=
         0;
}

// What a kernel does with a block of queries x keys: skip it, apply the mask per element, or
// use every element.
enum class BlockClass : uint8_t { kSkip, kMasked, kFull };

// Class of queries [i0, i1) x keys [j0, j1) (non-empty, inside the sequences). Callers treat a
// block cut short by the end of a sequence as kMasked, so element loops check bounds only there.
TESSEL_HD BlockClass block_class(const MaskParams& m, int b, int h, int i0, int i1, int j0,
                                 int j1) {
  if (m.tiles == nullptr) {
    // Over the block, p - j spans [p0 - (j1 - 1), p1 - j0] with p = i + shift.
    const int p0 = i0 + m.shift, p1 = i1 - 1 + m.shift;
    const int min_back = p0 - (j1 - 1), max_back = p1 - j0;
    const int min_fwd = j0 - p1, max_fwd = (j1 - 1) - p0;
    if ((m.left >= 0 && min_back > m.left) || (m.right >= 0 && min_fwd > m.right)) {
      return BlockClass::kSkip;
    }
    if ((m.left < 0 || max_back <= m.left) && (m.right < 0 || max_fwd <= m.right)) {
      return BlockClass::kFull;
    }
    return BlockClass::kMasked;
  }
  bool any = false, all_full = true;
  for (int ti = i0 / kMaskTile; ti <= (i1 - 1) / kMaskTile; ++ti) {
    for (int tj = j0 / kMaskTile; tj <= (j1 - 1) / kMaskTile; ++tj) {
      const int32_t t = tile_entry(m, b, h, ti, tj);
      any |= t != kTileEmpty;
      all_full &= t == kTileFull;
    }
  }
  return !any ? BlockClass::kSkip : all_full ? BlockClass::kFull : BlockClass::kMasked;
}

// Key blocks [*lo, *hi) of size block_n that queries [i0, i1) may see: the window's range
// without a tile map, every block with one (its empty tiles are skipped one by one).
TESSEL_HD void key_block_range(const MaskParams& m, int kv_len, int block_n, int i0, int i1,
                               int* lo, int* hi) {
  int j_lo = 0, j_hi = kv_len;
  if (m.tiles == nullptr) {
    if (m.left >= 0 && i0 + m.shift - m.left > j_lo) j_lo = i0 + m.shift - m.left;
    if (m.right >= 0 && i1 + m.shift + m.right < j_hi) j_hi = i1 + m.shift + m.right;
  }
  if (j_hi <= j_lo) {
    *lo = *hi = 0;
    return;
  }
  *lo = j_lo / block_n;
  *hi = (j_hi + block_n - 1) / block_n;
}

// Query blocks [*lo, *hi) of size block_m that may see keys [j0, j1).
TESSEL_HD void query_block_range(const MaskParams& m, int q_len, int block_m, int j0, int j1,
                                 int* lo, int* hi) {
  int i_lo = 0, i_hi = q_len;
  if (m.tiles == nullptr) {
    // p - j <= left needs i <= j1 - 1 + left - shift; j - p <= right needs i >= j0 - right - shift.
    if (m.left >= 0 && j1 + m.left - m.shift < i_hi) i_hi = j1 + m.left - m.shift;
    if (m.right >= 0 && j0 - m.right - m.shift > i_lo) i_lo = j0 - m.right - m.shift;
  }
  if (i_hi <= i_lo) {
    *lo = *hi = 0;
    return;
  }
  *lo = i_lo / block_m;
  *hi = (i_hi + block_m - 1) / block_m;
}

// ---- Dropout -----------------------------------------------------------------------------

// Philox4x32 with 10 rounds (tensor/random.h's generator, written for the device too).
TESSEL_HD void philox4x32_10(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = static_cast<uint32_t>(p1);
    c[2] = n2;
    c[3] = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// The Philox words of the dropout group of (i, j) (attention_dropout.h).
TESSEL_HD void dropout_group(const DropoutParams& d, int b, int h, int i, int j, uint32_t (&c)[4]) {
  c[0] = static_cast<uint32_t>((j >> 4) * 8 + (j & 7));
  c[1] = static_cast<uint32_t>((i >> 4) * 8 + (i & 7));
  c[2] = static_cast<uint32_t>((static_cast<int64_t>(b) << 16) ^ h);
  c[3] = d.offset;
  philox4x32_10(c, d.key0, d.key1);
}

// Keep decision of key j for query i of (b, h) (one call for one element: the math backend).
TESSEL_HD bool dropout_keep(const DropoutParams& d, int b, int h, int i, int j) {
  uint32_t c[4];
  dropout_group(d, b, h, i, j, c);
  const uint32_t r = (i & 8) ? ((j & 8) ? c[3] : c[2]) : ((j & 8) ? c[1] : c[0]);
  return r >= d.threshold;
}

// The four decisions of one Philox call, for i % 16 < 8 and j % 16 < 8: keep[0] (i, j),
// keep[1] (i, j + 8), keep[2] (i + 8, j), keep[3] (i + 8, j + 8).
TESSEL_HD void dropout_keep4(const DropoutParams& d, int b, int h, int i, int j, bool (&keep)[4]) {
  uint32_t c[4];
  dropout_group(d, b, h, i, j, c);
  keep[0] = c[0] >= d.threshold;
  keep[1] = c[1] >= d.threshold;
  keep[2] = c[2] >= d.threshold;
  keep[3] = c[3] >= d.threshold;
}

// ---- Shared-memory tiles -----------------------------------------------------------------

// A kRows x kCols tile of 16-bit elements in shared memory, its 16-byte chunks XOR-swizzled by
// row (chunk c of row r sits at c ^ (r % 8)), so the eight row addresses of one ldmatrix, or
// eight rows' 4-byte stores at one column, fall in distinct banks. kCols is 64 or 128 (a row
// is 128 or 256 bytes) and the tile starts at a multiple of 256 bytes of the shared window.
//
// Stepping: from the address of (r, c), with c % 16 < 8, element (r + 8 a, c + 16 b) is at
// step(addr, 8 a, b) = (addr + 8 a rows) ^ 32 b — the row part is linear and a step of whole
// 16-column pairs flips only chunk bits the row's XOR pattern leaves alone. Kernels compute one
// address per lane and step from it with constants, instead of a swizzle per access.
template <int kRows, int kCols>
struct SmemTile {
  static_assert(kCols == 64 || kCols == 128, "a row must be 128 or 256 bytes");
  static constexpr int kRowBytes = kCols * 2;
  static constexpr int kBytes = kRows * kRowBytes;
  SmemAddr base;

  TESSEL_DEVICE SmemAddr at(int r, int c) const {
    return base + r * kRowBytes + ((((c >> 3) ^ (r & 7))) << 4) + 2 * (c & 7);
  }
  // See above: rows a multiple of 8, col_pairs counts 16-column steps.
  TESSEL_DEVICE static SmemAddr step(SmemAddr addr, int rows, int col_pairs) {
    return smem_xor(addr + rows * kRowBytes, static_cast<uint32_t>(col_pairs) * 32u);
  }
};

}  // namespace tessel::kernels::attention::cuda
