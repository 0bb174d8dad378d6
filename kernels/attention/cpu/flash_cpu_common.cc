#include <algorithm>
#include <cstring>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/flash_common.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::kernels::attention {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kScalar: return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

CpuIsa detect_cpu_isa() {
  if (cpu_isa_supported(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_isa_supported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

namespace internal {

FlashPlan make_flash_plan(const AttentionProblem& p, const FlashCpuOptions& o) {
  validate_attention_problem(p);
  TESSEL_CHECK(p.q.device.is_cpu(), InvalidArgument,
               "flash_cpu: tensors are on {}; expected cpu", p.q.device.str());
  TESSEL_CHECK(o.block_q >= 1, InvalidArgument, "flash_cpu: block_q {} < 1", o.block_q);
  TESSEL_CHECK(o.block_kv >= kTileWidth && o.block_kv % kTileWidth == 0, InvalidArgument,
               "flash_cpu: block_kv {} is not a positive multiple of {}", o.block_kv,
               kTileWidth);
  const CpuIsa isa = o.isa == CpuIsa::kAuto ? detect_cpu_isa() : o.isa;
  TESSEL_CHECK(cpu_isa_supported(isa), Unavailable,
               "flash_cpu: instruction set {} requested but this CPU does not support it",
               cpu_isa_name(isa));
  FlashPlan plan;
  plan.ops = isa == CpuIsa::kAvx512 ? &tile_ops_avx512()
             : isa == CpuIsa::kAvx2 ? &tile_ops_avx2()
                                    : &tile_ops_scalar();
  plan.threads = ForkJoin(o.threads).threads();
  plan.batch = p.batch();
  plan.q_heads = p.q_heads();
  plan.kv_heads = p.kv_heads();
  plan.group = p.kv_heads() > 0 ? p.q_heads() / p.kv_heads() : 1;
  plan.sq = p.q_len();
  plan.sk = p.kv_len();
  plan.d = p.head_dim();
  plan.dp = std::max<int64_t>(kTileWidth, round_up(plan.d, kTileWidth));
  plan.bq = o.block_q;
  plan.bk = o.block_kv;
  plan.q_blocks = ceil_div(plan.sq, plan.bq);
  plan.kv_blocks = ceil_div(plan.sk, plan.bk);
  plan.scale = static_cast<float>(p.softmax_scale());
  // vdpbf16ps pays for bf16 inputs (measured in bench/attention_cpu); it needs whole bf16 pairs
  // of keys per block and a positive scale (the softmax step takes the max before scaling).
  if (o.bf16_dot_products && p.q.dtype == DType::kBF16 && isa == CpuIsa::kAvx512 &&
      __builtin_cpu_supports("avx512bf16") && plan.bk % 32 == 0 && plan.scale > 0) {
    plan.bf16 = &tile_ops_avx512_bf16();
  }
  return plan;
}

void load_rows(const AttentionView& view, int64_t b, int64_t h, int64_t s0, int64_t rows,
               int64_t rows_total, float* dst, int64_t ld, float mul) {
  const int64_t d = view.head_dim();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = dst + r * ld;
    load_row(view, b, h, s0 + r, row);
    if (mul != 1.0f) {
      for (int64_t c = 0; c < d; ++c) row[c] *= mul;
    }
    std::fill(row + d, row + ld, 0.0f);
  }
  std::fill(dst + rows * ld, dst + rows_total * ld, 0.0f);
}

void load_rows_transposed(const AttentionView& view, int64_t b, int64_t h, int64_t s0,
                          int64_t rows, int64_t bk, int64_t dp, float* dst, float* scratch) {
  load_rows(view, b, h, s0, rows, bk, scratch, dp);
  for (int64_t r = 0; r < bk; ++r) {
    for (int64_t c = 0; c < dp; ++c) dst[c * bk + r] = scratch[r * dp + c];
  }
}

void mask_tile_row(const MaskEvaluator& mask, int64_t b, int64_t h, int64_t i, int64_t j0,
                   int64_t cols, float* row, int64_t step) {
  if (mask.rows_are_ranges()) {
    int64_t lo, hi;
    mask.window_range(i, &lo, &hi);
    lo = std::clamp<int64_t>(lo - j0, 0, cols);
    hi = std::clamp<int64_t>(hi - j0, lo, cols);
    for (int64_t c = 0; c < lo; ++c) row[c * step] = kNegInf;
    for (int64_t c = hi; c < cols; ++c) row[c * step] = kNegInf;
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    if (!mask.visible(b, h, i, j0 + c)) row[c * step] = kNegInf;
  }
}

}  // namespace internal
}  // namespace tessel::kernels::attention
