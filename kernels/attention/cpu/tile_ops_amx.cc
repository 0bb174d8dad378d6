// AMX-BF16 GEMM kernel for flash_cpu's bf16 tiles (compiled with -mamx-tile -mamx-bf16; called
// only where amx_tiles_usable() says the CPU and the kernel allow it).
//
// Every thread uses one fixed tile configuration: eight 16-row x 64-byte tiles, tmm0..3 a 2 x 2
// block of C (32 x 32 f32), tmm4..5 two A tiles (16 rows x 16 pairs each), tmm6..7 two B tiles
// (16 pair-rows x 16 columns each). The operands are padded by the callers to whole tiles, so
// no tile is ever partial and one configuration serves every call.
#include <immintrin.h>

#include <cstdint>

#include "tessel/kernels/attention/cpu/internal/tile_ops.h"

namespace tessel::kernels::attention::internal {
namespace amx {
namespace {

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

void configure() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  // Not _tile_loadconfig: GCC 12's version tells the compiler it reads only a pointer's worth
  // of the operand, so the stores of the rows and widths above were dropped as dead.
  asm volatile("ldtilecfg %0" : : "m"(config));
}

void release() { _tile_release(); }

// One (16 * MT) x (16 * NT) block of C over the whole reduction; MT, NT in {1, 2}. Tile numbers
// must be compile-time constants, hence the template.
// b1 and c1 are the second column block of B and C.
template <int MT, int NT>
void block(int64_t k_pairs, const uint32_t* a, int64_t lda, const uint32_t* b, const uint32_t* b1,
           int64_t ldb, float* c, float* c1, int64_t ldc, bool accumulate) {
  const int64_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;  // strides in bytes
  if (accumulate) {
    _tile_loadd(0, c, sc);
    if constexpr (NT == 2) _tile_loadd(1, c1, sc);
    if constexpr (MT == 2) _tile_loadd(2, c + 16 * ldc, sc);
    if constexpr (MT == 2 && NT == 2) _tile_loadd(3, c1 + 16 * ldc, sc);
  } else {
    _tile_zero(0);
    if constexpr (NT == 2) _tile_zero(1);
    if constexpr (MT == 2) _tile_zero(2);
    if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  }
  for (int64_t p = 0; p < k_pairs; p += 16) {
    _tile_loadd(4, a + p, sa);
    _tile_loadd(6, b + p * ldb, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) {
      _tile_loadd(7, b1 + p * ldb, sb);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MT == 2) {
      _tile_loadd(5, a + 16 * lda + p, sa);
      _tile_dpbf16ps(2, 5, 6);
    }
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  if constexpr (NT == 2) _tile_stored(1, c1, sc);
  if constexpr (MT == 2) _tile_stored(2, c + 16 * ldc, sc);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c1 + 16 * ldc, sc);
}

// C = A B for k_pairs == 32 (D <= 64 in attention) and n a multiple of 32: the four B tiles of
// a 32-column block stay in tmm4..7 while A runs down the rows (tmm2..3, C in tmm0..1), so each
// 16 rows cost 2 loads, 4 products and 2 stores instead of 2 x 2 blocks' 4 loads per 4 products.
void gemm_b_resident(int64_t m, int64_t n, const uint32_t* a, int64_t lda, const uint32_t* b,
                     int64_t ldb, int64_t b_block, float* c, int64_t ldc, int64_t c_block) {
  const int64_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;  // strides in bytes
  for (int64_t j = 0; j < n; j += 32) {
    const uint32_t* b0 = b + j / 16 * b_block;
    const uint32_t* b1 = b0 + b_block;
    _tile_loadd(4, b0, sb);
    _tile_loadd(5, b0 + 16 * ldb, sb);
    _tile_loadd(6, b1, sb);
    _tile_loadd(7, b1 + 16 * ldb, sb);
    float* c0 = c + j / 16 * c_block;
    float* c1 = c0 + c_block;
    for (int64_t i = 0; i < m; i += 16) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(2, a + i * lda, sa);
      _tile_loadd(3, a + i * lda + 16, sa);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 2, 6);
      _tile_dpbf16ps(0, 3, 5);
      _tile_dpbf16ps(1, 3, 7);
      _tile_stored(0, c0 + i * ldc, sc);
      _tile_stored(1, c1 + i * ldc, sc);
    }
  }
}

void gemm(int64_t m, int64_t n, int64_t k_pairs, const uint32_t* a, int64_t lda, const uint32_t* b,
          int64_t ldb, int64_t b_block, float* c, int64_t ldc, int64_t c_block, bool accumulate) {
  if (k_pairs == 32 && n % 32 == 0 && !accumulate) {
    gemm_b_resident(m, n, a, lda, b, ldb, b_block, c, ldc, c_block);
    return;
  }
  for (int64_t i = 0; i < m; i += 32) {
    const bool two_m = i + 16 < m;
    for (int64_t j = 0; j < n; j += 32) {
      const bool two_n = j + 16 < n;
      const uint32_t* ai = a + i * lda;
      const uint32_t* bj = b + j / 16 * b_block;
      float* cij = c + i * ldc + j / 16 * c_block;
      if (two_m && two_n) {
        block<2, 2>(k_pairs, ai, lda, bj, bj + b_block, ldb, cij, cij + c_block, ldc, accumulate);
      } else if (two_m) {
        block<2, 1>(k_pairs, ai, lda, bj, bj, ldb, cij, cij, ldc, accumulate);
      } else if (two_n) {
        block<1, 2>(k_pairs, ai, lda, bj, bj + b_block, ldb, cij, cij + c_block, ldc, accumulate);
      } else {
        block<1, 1>(k_pairs, ai, lda, bj, bj, ldb, cij, cij, ldc, accumulate);
      }
    }
  }
}

}  // namespace
}  // namespace amx

const AmxTileOps& tile_ops_amx() {
  static const AmxTileOps ops{&amx::configure, &amx::release, &amx::gemm};
  return ops;
}

}  // namespace tessel::kernels::attention::internal
