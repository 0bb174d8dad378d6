#pragma once
// Pieces shared by flash_cpu's forward and backward drivers. Private to kernels/attention/cpu.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/tile_ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::kernels::attention::internal {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// A call's large work array (K and V laid out once, query operands, the dq accumulator), from
// tessel's CPU allocator, which keeps freed blocks of 1 MiB or more for reuse: the next call
// finds its pages mapped, where std::vector's memory came back from the system with a page
// fault per 4 KiB on every call. Contents are undefined unless a fill value is given. Copies
// share the array.
template <typename T>
class Workspace {
 public:
  Workspace() = default;
  explicit Workspace(size_t n)
      : n_(n), storage_(n > 0 ? Storage::allocate(n * sizeof(T), Device::cpu()) : Storage()) {}
  Workspace(size_t n, T fill) : Workspace(n) { std::fill(begin(), end(), fill); }
  T* data() const { return n_ > 0 ? static_cast<T*>(storage_.data()) : nullptr; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T* begin() const { return data(); }
  T* end() const { return data() + n_; }

 private:
  size_t n_ = 0;
  Storage storage_;
};

// Allocates on 64-byte boundaries: std::allocator's 16-byte alignment would make most 64-byte
// vector loads and stores of a tile row straddle two cache lines (the forward's GEMMs measured
// 5-8% slower so).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

// A per-thread tile: zero-initialised like std::vector, its data() on a cache-line boundary.
template <typename T>
using TileVector = std::vector<T, CacheLineAllocator<T>>;

// Resolved sizes and kernels for one call.
struct FlashPlan {
  const TileOps* ops = nullptr;
  const Bf16TileOps* bf16 = nullptr;  // bf16 dot-product GEMMs, when usable
  const AmxTileOps* amx = nullptr;    // with bf16: the GEMMs on AMX tiles instead
  int threads = 1;
  int64_t batch = 0, q_heads = 0, kv_heads = 0, group = 1;
  int64_t sq = 0, sk = 0, d = 0;
  int64_t dp = 0;  // d padded to kTileWidth (to 32 for AMX)
  int64_t bq = 64, bk = 64;
  int64_t q_blocks = 0, kv_blocks = 0;
  float scale = 1.0f;
};

// Configures the calling thread's AMX tiles for its lifetime (nothing when amx is null) and
// releases them when it ends, so that no tile state outlives a task.
class AmxTileScope {
 public:
  explicit AmxTileScope(const AmxTileOps* amx) : amx_(amx) {
    if (amx_) amx_->configure();
  }
  ~AmxTileScope() {
    if (amx_) amx_->release();
  }
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;

 private:
  const AmxTileOps* amx_;
};

// Validates options, picks the kernels; throws InvalidArgument / Unavailable.
FlashPlan make_flash_plan(const AttentionProblem& problem, const FlashCpuOptions& options);

// dst[r * ld + c] = view[b, h, s0 + r, c] * mul for r < rows, c < D; zero for c in [D, ld) and
// rows in [rows, rows_total).
void load_rows(const AttentionView& view, int64_t b, int64_t h, int64_t s0, int64_t rows,
               int64_t rows_total, float* dst, int64_t ld, float mul = 1.0f);

// dst (dp x bk) = transpose of view rows [s0, s0 + rows) of (b, h), zero padded.
void load_rows_transposed(const AttentionView& view, int64_t b, int64_t h, int64_t s0, int64_t rows,
                          int64_t bk, int64_t dp, float* dst, float* scratch);

// view[b, h, s, 0..D) as bf16 bits into dst (exact for bf16 views, rounded to nearest even
// for f32), zeros in [D, ld).
void load_row_bf16(const AttentionView& view, int64_t b, int64_t h, int64_t s, uint16_t* dst,
                   int64_t ld);

// Two bf16 as one pair: lo in the low half, as vdpbf16ps and tdpbf16ps read them.
inline uint32_t bf16_pair(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }

// delta[bh * S_q + i] = sum_d dO[b, h, i, d] * O[b, h, i, d], the row term of dS.
std::vector<float> output_dot(const AttentionView& out, const AttentionView& dout,
                              const FlashPlan& plan, const ForkJoin& team);

// Sets row[c * step] = -inf for the keys j0 + c (c < cols) that query i of (b, h) may not see:
// by range when the mask allows it, else element by element.
void mask_tile_row(const MaskEvaluator& mask, int64_t b, int64_t h, int64_t i, int64_t j0,
                   int64_t cols, float* row, int64_t step = 1);

// One (query block, key block) tile of the backward pass: batch, query head, the rows
// [i0, i0 + rows) and keys [j0, j0 + cols) it covers, and its mask class.
struct BackwardTile {
  int64_t b, h, i0, rows, j0, cols;
  TileClass tile;
};

// Calls fn(tile) for every non-empty tile of key block kb of (batch b, kv head hk): the query
// blocks of every query head in its group, starting at a block that depends on kb so that
// workers on neighbouring key blocks rarely contend for the same dq lock.
template <class Fn>
void for_each_backward_tile(const FlashPlan& plan, const MaskEvaluator& mask, bool full_mask,
                            int64_t b, int64_t hk, int64_t kb, Fn&& fn) {
  const int64_t j0 = kb * plan.bk, cols = std::min(plan.bk, plan.sk - j0);
  for (int64_t h = hk * plan.group; h < (hk + 1) * plan.group; ++h) {
    for (int64_t t = 0; t < plan.q_blocks; ++t) {
      const int64_t i0 = (kb + t) % plan.q_blocks * plan.bq;
      const int64_t rows = std::min(plan.bq, plan.sq - i0);
      const TileClass tile =
          full_mask ? TileClass::kFull : mask.classify(b, i0, i0 + rows, j0, j0 + cols);
      if (tile != TileClass::kEmpty) fn(BackwardTile{b, h, i0, rows, j0, cols, tile});
    }
  }
}

// In place of the tile's scores s (rows x bk, row-major; rows from t.rows on untouched):
// P = exp2(s_mul * s - log2(e) * lse[r]), masked, 0 past t.cols and in rows that see no key
// (lse -inf); lse points at the tile's first row. With dropout also keep (the scaled keep mask,
// 0 past t.cols) and pdrop = P * keep. Returns P_drop: pdrop, or s without dropout.
const float* backward_probabilities(const TileOps& ops, const MaskEvaluator& mask,
                                    const DropoutMask& drop, const BackwardTile& t,
                                    const float* lse, float s_mul, int64_t bk, float* s,
                                    float* keep, float* pdrop);

// dq = scale * the f32 accumulator, rounded to dq's dtype. The accumulator holds per
// (batch, head, query block) a bq x dp block, row-major, or with column_blocks by blocks of 16
// columns ([dp / 16][bq][16], the AMX layout).
void store_dq(const AttentionView& dq, const FlashPlan& plan, const float* dq_acc,
              const ForkJoin& team, bool column_blocks);

// flash_cpu_backward for a plan with AMX tiles (plan.amx), after the arguments are checked.
void flash_cpu_backward_amx(const AttentionProblem& problem, const FlashPlan& plan,
                            const AttentionView& out, const AttentionView& dout, const float* lse,
                            const AttentionView& dq, const AttentionView& dk,
                            const AttentionView& dv);

}  // namespace tessel::kernels::attention::internal
