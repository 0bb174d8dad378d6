#include <algorithm>
#include <cstring>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/cpu/fork_join.h"
#include "tessel/kernels/attention/cpu/internal/flash_common.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::kernels::attention {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "?";
}

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    case CpuIsa::kAmx:
      return cpu_isa_supported(CpuIsa::kAvx512) && internal::amx_tiles_usable();
  }
  return false;
}

CpuIsa detect_cpu_isa() {
  if (cpu_isa_supported(CpuIsa::kAmx)) return CpuIsa::kAmx;
  if (cpu_isa_supported(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (cpu_isa_supported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

namespace internal {

namespace {

// What a call runs, from the dtype and the options alone (no sizes): shared by the plan and
// flash_cpu_kernel_name. Throws InvalidArgument / Unavailable.
struct KernelChoice {
  CpuIsa isa = CpuIsa::kScalar;
  bool bf16_pairs = false;  // bf16 GEMMs (vdpbf16ps or AMX)
  bool amx = false;         // ... on AMX tiles
  int block_kv = 64;
};

KernelChoice choose_kernels(DType dtype, const FlashCpuOptions& o) {
  TESSEL_CHECK(o.block_q >= 1, InvalidArgument, "flash_cpu: block_q {} < 1", o.block_q);
  TESSEL_CHECK(o.block_kv == 0 || (o.block_kv >= kTileWidth && o.block_kv % kTileWidth == 0),
               InvalidArgument, "flash_cpu: block_kv {} is not 0 or a positive multiple of {}",
               o.block_kv, kTileWidth);
  KernelChoice k;
  k.isa = o.isa == CpuIsa::kAuto ? detect_cpu_isa() : o.isa;
  TESSEL_CHECK(cpu_isa_supported(k.isa), Unavailable,
               "flash_cpu: instruction set {} requested but this CPU does not support it{}",
               cpu_isa_name(k.isa),
               k.isa == CpuIsa::kAmx && cpu_isa_supported(CpuIsa::kAvx512)
                   ? " (or the kernel did not grant the AMX tile state)"
                   : "");
  const bool wide = k.isa == CpuIsa::kAvx512 || k.isa == CpuIsa::kAmx;
  // bf16 GEMMs pay for bf16 inputs (measured in bench/attention_cpu); they need whole bf16
  // pairs of keys per block. AMX also needs whole pairs of queries per tile row of 16 pairs.
  const bool pairs =
      o.bf16_dot_products && dtype == DType::kBF16 && wide && __builtin_cpu_supports("avx512bf16");
  k.block_kv = o.block_kv > 0 ? o.block_kv : pairs && k.isa == CpuIsa::kAmx ? 128 : 64;
  k.bf16_pairs = pairs && k.block_kv % 32 == 0;
  k.amx = k.bf16_pairs && k.isa == CpuIsa::kAmx && o.block_q % 32 == 0;
  return k;
}

}  // namespace

FlashPlan make_flash_plan(const AttentionProblem& p, const FlashCpuOptions& o) {
  validate_attention_problem(p);
  TESSEL_CHECK(p.q.device.is_cpu(), InvalidArgument, "flash_cpu: tensors are on {}; expected cpu",
               p.q.device.str());
  TESSEL_CHECK(p.q.dtype != DType::kF16, InvalidArgument,
               "flash_cpu: dtype f16; flash_cpu supports f32 and bf16");
  const KernelChoice k = choose_kernels(p.q.dtype, o);
  FlashPlan plan;
  plan.ops = k.isa == CpuIsa::kAvx512 || k.isa == CpuIsa::kAmx ? &tile_ops_avx512()
             : k.isa == CpuIsa::kAvx2                          ? &tile_ops_avx2()
                                                               : &tile_ops_scalar();
  plan.threads = ForkJoin(o.threads).threads();
  plan.batch = p.batch();
  plan.q_heads = p.q_heads();
  plan.kv_heads = p.kv_heads();
  plan.group = p.kv_heads() > 0 ? p.q_heads() / p.kv_heads() : 1;
  plan.sq = p.q_len();
  plan.sk = p.kv_len();
  plan.d = p.head_dim();
  // AMX tiles reduce over 32 bf16 at a time: D is padded to that with zeros.
  plan.dp = std::max<int64_t>(kTileWidth, round_up(plan.d, k.amx ? 32 : kTileWidth));
  plan.bq = o.block_q;
  plan.bk = k.block_kv;
  plan.q_blocks = ceil_div(plan.sq, plan.bq);
  plan.kv_blocks = ceil_div(plan.sk, plan.bk);
  plan.scale = static_cast<float>(p.softmax_scale());
  // The softmax step takes the max before scaling: the bf16 GEMMs need a positive scale.
  if (k.bf16_pairs && plan.scale > 0) {
    plan.bf16 = &tile_ops_avx512_bf16();
    if (k.amx) plan.amx = &tile_ops_amx();
  } else {
    plan.dp = std::max<int64_t>(kTileWidth, round_up(plan.d, kTileWidth));
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

void load_rows_transposed(const AttentionView& view, int64_t b, int64_t h, int64_t s0, int64_t rows,
                          int64_t bk, int64_t dp, float* dst, float* scratch) {
  load_rows(view, b, h, s0, rows, bk, scratch, dp);
  for (int64_t r = 0; r < bk; ++r) {
    for (int64_t c = 0; c < dp; ++c) dst[c * bk + r] = scratch[r * dp + c];
  }
}

void load_row_bf16(const AttentionView& view, int64_t b, int64_t h, int64_t s, uint16_t* dst,
                   int64_t ld) {
  const int64_t d = view.head_dim(), ds = view.strides[3];
  if (view.dtype == DType::kBF16) {
    const uint16_t* src = static_cast<const uint16_t*>(view.data) + view.offset(b, h, s, 0);
    if (ds == 1) {
      std::memcpy(dst, src, static_cast<size_t>(d) * sizeof(uint16_t));
    } else {
      for (int64_t c = 0; c < d; ++c) dst[c] = src[c * ds];
    }
  } else {
    const float* src = static_cast<const float*>(view.data) + view.offset(b, h, s, 0);
    for (int64_t c = 0; c < d; ++c) dst[c] = BFloat16::from_float(src[c * ds]);
  }
  std::fill(dst + d, dst + ld, uint16_t{0});
}

std::vector<float> output_dot(const AttentionView& out, const AttentionView& dout,
                              const FlashPlan& plan, const ForkJoin& team) {
  std::vector<float> delta(plan.batch * plan.q_heads * plan.sq);
  std::vector<std::vector<float>> rows(team.threads(), std::vector<float>(2 * plan.d));
  team.run(plan.batch * plan.q_heads, [&](int worker, int64_t bh) {
    const int64_t b = bh / plan.q_heads, h = bh % plan.q_heads;
    float* o = rows[worker].data();
    float* g = o + plan.d;
    for (int64_t i = 0; i < plan.sq; ++i) {
      load_row(out, b, h, i, o);
      load_row(dout, b, h, i, g);
      float acc = 0;
      for (int64_t c = 0; c < plan.d; ++c) acc += o[c] * g[c];
      delta[bh * plan.sq + i] = acc;
    }
  });
  return delta;
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

const float* backward_probabilities(const TileOps& ops, const MaskEvaluator& mask,
                                    const DropoutMask& drop, const BackwardTile& t,
                                    const float* lse, float s_mul, int64_t bk, float* s,
                                    float* keep, float* pdrop) {
  for (int64_t r = 0; r < t.rows; ++r) {
    float* prow = s + r * bk;
    if (lse[r] == kNegInf) {
      std::fill(prow, prow + bk, 0.0f);
      continue;
    }
    if (t.tile == TileClass::kPartial) mask_tile_row(mask, t.b, t.h, t.i0 + r, t.j0, t.cols, prow);
    std::fill(prow + t.cols, prow + bk, kNegInf);
    ops.exp2_affine(prow, bk, s_mul, lse[r] * kLog2e);
  }
  if (!drop.enabled()) return s;
  drop.fill_rows(t.b, t.h, t.i0, t.rows, t.j0, t.cols, keep, bk);
  for (int64_t r = 0; r < t.rows; ++r) {
    float* k = keep + r * bk;
    std::fill(k + t.cols, k + bk, 0.0f);
    for (int64_t c = 0; c < bk; ++c) pdrop[r * bk + c] = s[r * bk + c] * k[c];
  }
  return pdrop;
}

void store_dq(const AttentionView& dq, const FlashPlan& plan, const float* dq_acc,
              const ForkJoin& team, bool column_blocks) {
  const int64_t bq = plan.bq, dp = plan.dp;
  std::vector<std::vector<float>> rows(team.threads(), std::vector<float>(dp));
  team.run(plan.batch * plan.q_heads, [&](int worker, int64_t bh) {
    const int64_t b = bh / plan.q_heads, h = bh % plan.q_heads;
    for (int64_t i = 0; i < plan.sq; ++i) {
      const float* block = dq_acc + (bh * plan.q_blocks + i / bq) * bq * dp;
      const float* row = block + i % bq * dp;
      if (column_blocks) {
        float* gathered = rows[worker].data();
        for (int64_t c = 0; c < dp; ++c) {
          gathered[c] = block[c / 16 * bq * 16 + i % bq * 16 + c % 16];
        }
        row = gathered;
      }
      store_row(dq, b, h, i, row, plan.scale);
    }
  });
}

}  // namespace internal

std::string_view flash_cpu_kernel_name(DType dtype, const FlashCpuOptions& options) {
  const internal::KernelChoice k = internal::choose_kernels(dtype, options);
  if (k.amx) return "amx-bf16";
  if (k.bf16_pairs) return "avx512-bf16";
  return k.isa == CpuIsa::kAmx ? cpu_isa_name(CpuIsa::kAvx512) : cpu_isa_name(k.isa);
}

}  // namespace tessel::kernels::attention
