#pragma once
// Small dense kernels that flash_cpu's tiles are made of, compiled once per instruction set
// (AVX-512, AVX2+FMA, scalar) in files with their own compiler flags; the driver picks a table
// at run time from the CPU's features. Private to kernels/attention/cpu.

#include <cstdint>

namespace tessel::kernels::attention::internal {

// Every n below must be a multiple of kTileWidth (buffers are padded to it).
inline constexpr int kTileWidth = 16;

struct TileOps {
  const char* name;
  // C[m x n] = (accumulate ? C : 0) + A B, where A(r, p) = a[r * a_row + p * a_col] (so A or
  // its transpose can be read in place), B is row-major with leading dimension ldb, C with ldc.
  void (*gemm)(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);
  // x[j] = exp2(x[j] * mul - sub) for j < n, for arguments <= 0 (exactly 0 where x[j] is -inf
  // or the result is below 2^-126); returns the sum.
  float (*exp2_affine)(float* x, int64_t n, float mul, float sub);
  // One online-softmax step of FlashAttention-2 over a transposed tile of scores st (keys x n,
  // row-major: st[j * n + i] is query i's score for key j; entries a query may not see already
  // -inf), n a multiple of kTileWidth, mul > 0. For every query i < n:
  //   m' = max(m[i], mul * max_j st[j, i]) or m[i];  st[j, i] = 2^(mul * st[j, i] - m');
  //   alpha[i] = 2^(m[i] - m');  l[i] = l[i] * alpha[i] + sum_j st[j, i];  m[i] = m';
  // and the transposed output accumulator ot (out_rows x n, row-major) has column i scaled by
  // alpha[i]. m' stays m[i] (alpha 1) while every score of the vector of queries that i
  // belongs to stays within kRescaleSlack (8) of its m: m is then a reference, not always the
  // maximum, and the probabilities stay below 2^8; m + log2(l) is the same either way. A query
  // with m' = -inf (no visible key so far) gets zeros and alpha 0 or 1.
  void (*softmax_step)(float* st, int64_t keys, int64_t n, float mul, float* m, float* l, float* ot,
                       int64_t out_rows, float* alpha);
  // The backward's dS in place of dP (rows x n, row-major, n a multiple of kTileWidth):
  // dp[r][j] = p[r][j] * (dp[r][j] * keep[r][j] - delta[r]), keep null without dropout.
  void (*ds_rows)(const float* p, const float* keep, const float* delta, int64_t rows, int64_t n,
                  float* dp);
  // dst[c * ld_dst + r] = src[r * ld_src + c] * (col_scale ? col_scale[c] : 1) for r < rows,
  // c < cols (any sizes; src and dst must not overlap).
  void (*transpose)(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
                    int64_t ld_dst, const float* col_scale);
};

// bf16 dot-product kernels (AVX-512 BF16, vdpbf16ps). A and B hold pairs of bf16 adjacent along
// the reduction dimension in one uint32_t; each step of k_pairs adds a 2-element dot product.
struct Bf16TileOps {
  // C[m x n] (+)= A B as in TileOps::gemm, with A(r, p) = a[r * a_row + p * a_col] and B row p
  // at b + p * ldb (all in pairs); n a multiple of kTileWidth.
  void (*gemm)(int64_t m, int64_t n, int64_t k_pairs, const uint32_t* a, int64_t a_row,
               int64_t a_col, const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
               bool accumulate);
  // dst[0..n) = src rounded to bf16 (nearest even); n a multiple of 16.
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n);
  // dst[j] = (bf16(lo[j]), bf16(hi[j])) as one pair (hi null: 0) for j < n, n a multiple of 16:
  // interleaves two rows so that pairs run along the row index.
  void (*to_bf16_pairs)(const float* lo, const float* hi, uint32_t* dst, int64_t n);
  // Pairs of consecutive rows of src (rows x n, row-major; rows even, n a multiple of 16) as
  // bf16, by column blocks of 16 for AMX B tiles: dst[(j / 16) * (rows / 2) * 16 + t * 16 +
  // j % 16] = (bf16(src[2t][j]), bf16(src[2t + 1][j])).
  void (*pair_rows_blocked)(const float* src, int64_t rows, int64_t n, uint32_t* dst);
  // TileOps::softmax_step for one column block of 16 queries (st: keys x 16, ot: out_rows x 16,
  // m, l, alpha: 16 each), fused with the conversion of P for the AMX GEMM P V: st is left as
  // it was and the probabilities, times keep[j * 16 + i] unless keep is null, go to pt as
  // pairs of consecutive keys, pt[t * 16 + i] = (bf16(P[2t][i]), bf16(P[2t+1][i])), zero from
  // pair ceil(keys / 2) to pairs. l sums the probabilities before the keep mask.
  void (*softmax_pairs)(const float* st, int64_t keys, float mul, const float* keep, float* m,
                        float* l, float* ot, int64_t out_rows, float* alpha, uint32_t* pt,
                        int64_t pairs);
};

// bf16 GEMMs on AMX tiles (tdpbf16ps: a 16 x 16 f32 tile += 16 x 32 bf16 times 32 x 16 bf16).
// A thread must call configure() before gemm() and release() when done (tilerelease returns
// the tile state to its initial, cheap-to-switch state); between the two it must not run
// other AMX code (oneDNN configures its own tiles).
struct AmxTileOps {
  void (*configure)();
  void (*release)();
  // C[m x n] (+)= A B with A row-major in pairs along the reduction dimension (row r at
  // a + r * lda, k_pairs pairs) and B in pairs along it (the "VNNI" layout); m, n and k_pairs
  // multiples of 16. B and C are stored by blocks of 16 columns: element (p, j) of B at
  // b + (j / 16) * b_block + p * ldb + j % 16, (i, j) of C at c + (j / 16) * c_block +
  // i * ldc + j % 16; row-major is b_block = c_block = 16, and ldb = ldc = 16 keeps each tile's
  // rows contiguous (stores and loads of whole 1 KiB tiles are markedly faster than of rows
  // far apart). lda, ldb, b_block in pairs; ldc, c_block in floats.
  void (*gemm)(int64_t m, int64_t n, int64_t k_pairs, const uint32_t* a, int64_t lda,
               const uint32_t* b, int64_t ldb, int64_t b_block, float* c, int64_t ldc,
               int64_t c_block, bool accumulate);
};

// Tables per instruction set; each is safe to call only where the CPU supports that set (for
// AMX: amx_tiles_usable()).
const TileOps& tile_ops_avx512();
const TileOps& tile_ops_avx2();
const TileOps& tile_ops_scalar();
const Bf16TileOps& tile_ops_avx512_bf16();
const AmxTileOps& tile_ops_amx();

// True when the CPU has AMX-BF16 (with AVX-512 BF16) and the OS lets this process use the tile
// data; the first call asks the kernel for that permission (thread-safe, asked once).
bool amx_tiles_usable();

}  // namespace tessel::kernels::attention::internal
