// bf16 by FlashAttention's rule: flash_cpu's error against an f64 reference (computed from the
// same bf16 inputs) is at most twice the math backend's own bf16 error (bf16 intermediates,
// as an unfused bf16 composition rounds them), plus a small absolute slack.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_test_util.h"
#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"

namespace tessel::kernels::attention {
namespace {

using testing::Buffer;
using testing::MaskKind;
using testing::max_abs_diff;

struct Bf16Case {
  int64_t b, hq, hkv, sq, sk, d;
  bool causal;
  double dropout;
  CpuIsa isa;
  bool bf16_dot_products = true;    // false: bf16 converted to f32, f32 FMAs
  MaskKind mask = MaskKind::kNone;  // applied on top of causal and dropout
};

class FlashCpuBf16Test : public ::testing::TestWithParam<Bf16Case> {};

TEST_P(FlashCpuBf16Test, ErrorAtMostTwiceMathBf16Error) {
  const Bf16Case& c = GetParam();
  if (!cpu_isa_supported(c.isa)) GTEST_SKIP() << "CPU lacks " << cpu_isa_name(c.isa);
  testing::Qkv in(DType::kBF16, c.b, c.hq, c.hkv, c.sq, c.sk, c.d, 11);
  Buffer &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  AttentionProblem p = in.problem();
  p.mask.causal = c.causal;
  p.dropout = {c.dropout, 5, 6};
  testing::configure_mask(c.mask, c.b, c.sq, c.sk, p);

  // Reference: f64 accumulation, f32 outputs.
  Buffer ref_out(DType::kF32, c.b, c.hq, c.sq, c.d), ref_dq = ref_out;
  Buffer ref_dk(DType::kF32, c.b, c.hkv, c.sk, c.d), ref_dv = ref_dk;
  math_attention_forward(p, ref_out.view(), nullptr, {.f64_accumulate = true});
  math_attention_backward(p, dout.view(), ref_dq.view(), ref_dk.view(), ref_dv.view(),
                          {.f64_accumulate = true});
  // The math backend in bf16.
  Buffer m_out = q, m_dq = q, m_dk = k, m_dv = v;
  const MathOptions bf16_math{.round_intermediates = true};
  math_attention_forward(p, m_out.view(), nullptr, bf16_math);
  math_attention_backward(p, dout.view(), m_dq.view(), m_dk.view(), m_dv.view(), bf16_math);
  // flash_cpu in bf16.
  Buffer f_out = q, f_dq = q, f_dk = k, f_dv = v;
  std::vector<float> lse(c.b * c.hq * c.sq);
  const FlashCpuOptions opts{.isa = c.isa, .bf16_dot_products = c.bf16_dot_products};
  flash_cpu_forward(p, f_out.view(), lse.data(), opts);
  flash_cpu_backward(p, f_out.view(), dout.view(), lse.data(), f_dq.view(), f_dk.view(),
                     f_dv.view(), opts);

  const char* names[] = {"out", "dq", "dk", "dv"};
  const Buffer* refs[] = {&ref_out, &ref_dq, &ref_dk, &ref_dv};
  const Buffer* maths[] = {&m_out, &m_dq, &m_dk, &m_dv};
  const Buffer* flashes[] = {&f_out, &f_dq, &f_dk, &f_dv};
  for (int t = 0; t < 4; ++t) {
    const double math_err = max_abs_diff(maths[t]->values(), refs[t]->values());
    const double flash_err = max_abs_diff(flashes[t]->values(), refs[t]->values());
    EXPECT_LE(flash_err, 2 * math_err + 1e-5)
        << names[t] << ": flash " << flash_err << " vs math bf16 " << math_err;
  }
}

std::string bf16_name(const ::testing::TestParamInfo<Bf16Case>& info) {
  const Bf16Case& c = info.param;
  return fmt::format("B{}_Hq{}_Hkv{}_Sq{}_Sk{}_D{}{}{}_{}", c.b, c.hq, c.hkv, c.sq, c.sk, c.d,
                     c.causal ? "_causal" : "", c.dropout > 0 ? "_dropout" : "",
                     cpu_isa_name(c.isa)) +
         (c.bf16_dot_products ? "" : "_f32fma") +
         (c.mask == MaskKind::kNone ? "" : std::string("_") + mask_kind_name(c.mask));
}

INSTANTIATE_TEST_SUITE_P(
    Bf16, FlashCpuBf16Test,
    ::testing::Values(Bf16Case{1, 2, 2, 64, 64, 64, false, 0, CpuIsa::kAuto},
                      Bf16Case{2, 4, 2, 127, 128, 32, true, 0, CpuIsa::kAuto},
                      Bf16Case{1, 2, 1, 1000, 1000, 128, true, 0, CpuIsa::kAuto},
                      Bf16Case{3, 2, 2, 7, 127, 80, false, 0, CpuIsa::kAuto},
                      Bf16Case{1, 3, 3, 128, 1, 64, false, 0, CpuIsa::kAuto},
                      Bf16Case{2, 2, 1, 64, 127, 64, true, 0.1, CpuIsa::kAuto},
                      Bf16Case{1, 2, 2, 127, 64, 80, true, 0, CpuIsa::kAvx2},
                      Bf16Case{2, 4, 2, 127, 200, 64, true, 0.1, CpuIsa::kAuto, false},
                      Bf16Case{1, 2, 2, 64, 64, 32, false, 0, CpuIsa::kScalar}),
    bf16_name);

// Every mask kind on both bf16 dot-product paths, AMX tiles and vdpbf16ps, at shapes that
// leave partial tiles everywhere: S not a multiple of 16 or 32, D = 80 (AMX pads it to 96),
// GQA, a single key, more queries than keys and fewer. (Not dropout with a single key: there
// dS is exactly 0, the math backend's error is 0, and FlashAttention's delta = rowsum(dO * O),
// with O rounded to bf16, leaves a rounding error that no factor of 0 covers.)
std::vector<Bf16Case> mask_sweep() {
  const int64_t shapes[][3] = {{127, 200, 80}, {64, 1, 32}, {200, 127, 64}, {7, 64, 128}};
  std::vector<Bf16Case> cases;
  for (CpuIsa isa : {CpuIsa::kAmx, CpuIsa::kAvx512}) {
    for (int m = 0; m < static_cast<int>(MaskKind::kCount); ++m) {
      const auto* s = shapes[(m + m / 4) % 4];
      const int64_t b = 1 + m % 2, hkv = 1 + m % 2, hq = hkv * (1 + (m + 1) % 2);
      cases.push_back(
          {b, hq, hkv, s[0], s[1], s[2], false, 0, isa, true, static_cast<MaskKind>(m)});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Masks, FlashCpuBf16Test, ::testing::ValuesIn(mask_sweep()), bf16_name);

// Which kernels run: AMX tiles by default where the CPU allows them, each set when forced, the
// vdpbf16ps kernels where AMX's block sizes do not fit.
TEST(FlashCpuKernelTest, NamesTheKernelsThatRun) {
  const DType bf16 = DType::kBF16, f32 = DType::kF32;
  if (cpu_isa_supported(CpuIsa::kAmx)) {
    EXPECT_EQ(detect_cpu_isa(), CpuIsa::kAmx);
    EXPECT_EQ(flash_cpu_kernel_name(bf16), "amx-bf16");
    EXPECT_EQ(flash_cpu_kernel_name(bf16, {.isa = CpuIsa::kAmx, .block_q = 48}), "avx512-bf16");
    EXPECT_EQ(flash_cpu_kernel_name(f32), "avx512");
  } else {
    EXPECT_THROW(flash_cpu_kernel_name(bf16, {.isa = CpuIsa::kAmx}), Unavailable);
  }
  if (cpu_isa_supported(CpuIsa::kAvx512)) {
    EXPECT_EQ(flash_cpu_kernel_name(bf16, {.isa = CpuIsa::kAvx512}),
              __builtin_cpu_supports("avx512bf16") ? "avx512-bf16" : "avx512");
    EXPECT_EQ(flash_cpu_kernel_name(bf16, {.isa = CpuIsa::kAvx512, .bf16_dot_products = false}),
              "avx512");
  }
  if (cpu_isa_supported(CpuIsa::kAvx2)) {
    EXPECT_EQ(flash_cpu_kernel_name(bf16, {.isa = CpuIsa::kAvx2}), "avx2");
  }
  EXPECT_EQ(flash_cpu_kernel_name(f32, {.isa = CpuIsa::kScalar}), "scalar");
}

}  // namespace
}  // namespace tessel::kernels::attention
