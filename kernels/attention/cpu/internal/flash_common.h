#pragma once
// Pieces shared by flash_cpu's forward and backward drivers. Private to kernels/attention/cpu.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cpu/internal/tile_ops.h"

namespace tessel::kernels::attention::internal {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// Resolved sizes and kernels for one call.
struct FlashPlan {
  const TileOps* ops = nullptr;
  const Bf16TileOps* bf16 = nullptr;  // bf16 dot-product GEMMs for the forward, when usable
  int threads = 1;
  int64_t batch = 0, q_heads = 0, kv_heads = 0, group = 1;
  int64_t sq = 0, sk = 0, d = 0;
  int64_t dp = 0;        // d padded to kTileWidth
  int64_t bq = 64, bk = 64;
  int64_t q_blocks = 0, kv_blocks = 0;
  float scale = 1.0f;
};

// Validates options, picks the kernels; throws InvalidArgument / Unavailable.
FlashPlan make_flash_plan(const AttentionProblem& problem, const FlashCpuOptions& options);

// dst[r * ld + c] = view[b, h, s0 + r, c] * mul for r < rows, c < D; zero for c in [D, ld) and
// rows in [rows, rows_total).
void load_rows(const AttentionView& view, int64_t b, int64_t h, int64_t s0, int64_t rows,
               int64_t rows_total, float* dst, int64_t ld, float mul = 1.0f);

// dst (dp x bk) = transpose of view rows [s0, s0 + rows) of (b, h), zero padded.
void load_rows_transposed(const AttentionView& view, int64_t b, int64_t h, int64_t s0,
                          int64_t rows, int64_t bk, int64_t dp, float* dst, float* scratch);

// Sets row[c * step] = -inf for the keys j0 + c (c < cols) that query i of (b, h) may not see:
// by range when the mask allows it, else element by element.
void mask_tile_row(const MaskEvaluator& mask, int64_t b, int64_t h, int64_t i, int64_t j0,
                   int64_t cols, float* row, int64_t step = 1);

}  // namespace tessel::kernels::attention::internal
