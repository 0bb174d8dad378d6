// flash_cpu against the math backend (f64 accumulation) over a covering sweep of shapes,
// head layouts and mask kinds: forward output, logsumexp and dq/dk/dv.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"

namespace tessel::kernels::attention {
namespace {

using testing::Buffer;
using testing::configure_mask;
using testing::fill_normal;
using testing::mask_kind_name;
using testing::MaskKind;
using testing::max_abs;
using testing::max_abs_diff;

struct Case {
  int64_t b, hq, hkv, sq, sk, d;
  MaskKind mask;
  CpuIsa isa = CpuIsa::kAuto;
  int threads = 0;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("{}_B{}_Hq{}_Hkv{}_Sq{}_Sk{}_D{}_{}{}", mask_kind_name(c.mask), c.b, c.hq,
                     c.hkv, c.sq, c.sk, c.d, cpu_isa_name(c.isa),
                     c.threads > 0 ? fmt::format("_T{}", c.threads) : "");
}

class FlashCpuSweepTest : public ::testing::TestWithParam<Case> {};

TEST_P(FlashCpuSweepTest, MatchesMathForwardAndBackward) {
  const Case& c = GetParam();
  if (!cpu_isa_supported(c.isa)) GTEST_SKIP() << "CPU lacks " << cpu_isa_name(c.isa);
  testing::Qkv in(DType::kF32, c.b, c.hq, c.hkv, c.sq, c.sk, c.d, 1);
  Buffer &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  AttentionProblem p = in.problem();
  configure_mask(c.mask, c.b, c.sq, c.sk, p);

  Buffer out_ref = q, dq_ref = q, dk_ref = k, dv_ref = v;
  std::vector<float> lse_ref(c.b * c.hq * c.sq);
  const MathOptions f64{.f64_accumulate = true};
  math_attention_forward(p, out_ref.view(), lse_ref.data(), f64);
  math_attention_backward(p, dout.view(), dq_ref.view(), dk_ref.view(), dv_ref.view(), f64);

  Buffer out = q, dq = q, dk = k, dv = v;
  std::vector<float> lse(lse_ref.size());
  const FlashCpuOptions opts{.isa = c.isa, .threads = c.threads};
  flash_cpu_forward(p, out.view(), lse.data(), opts);
  flash_cpu_backward(p, out.view(), dout.view(), lse.data(), dq.view(), dk.view(), dv.view(), opts);

  // f32 with f32 accumulation against f64: errors scale with the magnitudes and sqrt(S).
  const double tol = 2e-5 * std::sqrt(double(std::max<int64_t>(c.sk, 1)));
  EXPECT_LE(max_abs_diff(out.values(), out_ref.values()), tol * (1 + max_abs(out_ref.values())));
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse_ref[i])) {
      ASSERT_EQ(lse[i], lse_ref[i]) << "row " << i << " should see no key";
    } else {
      ASSERT_NEAR(lse[i], lse_ref[i], 1e-4 * (1 + std::fabs(lse_ref[i]))) << "row " << i;
    }
  }
  EXPECT_LE(max_abs_diff(dq.values(), dq_ref.values()), tol * (1 + max_abs(dq_ref.values())));
  EXPECT_LE(max_abs_diff(dk.values(), dk_ref.values()), tol * (1 + max_abs(dk_ref.values())));
  EXPECT_LE(max_abs_diff(dv.values(), dv_ref.values()), tol * (1 + max_abs(dv_ref.values())));

  if (c.mask == MaskKind::kFullyMaskedRows) {
    // Row 0 of batch entry 0 sees no key: output exactly 0 and gradient exactly 0.
    for (int64_t d = 0; d < c.d; ++d) {
      ASSERT_EQ(out.at(d), 0.0f);
      ASSERT_EQ(dq.at(d), 0.0f);
    }
    EXPECT_EQ(lse[0], -INFINITY);
  }
}

// Each S value meets each mask kind and each D value; B cycles 1..3; GQA alternates with
// plain multi-head attention. One pass per instruction set, the non-native ones on a subset.
std::vector<Case> sweep_cases() {
  const int64_t seqs[] = {1, 7, 64, 127, 128, 1000};
  const int64_t dims[] = {32, 64, 80, 128};
  std::vector<Case> cases;
  const int kinds = static_cast<int>(MaskKind::kCount);
  for (int m = 0; m < kinds; ++m) {
    for (int t = 0; t < 6; ++t) {
      const int64_t sq = seqs[t];
      const int64_t sk = seqs[(t + m) % 6];
      const int64_t d = dims[(t + m) % 4];
      const int64_t b = 1 + (t + m) % 3;
      const bool gqa = (t + m) % 2 == 0;
      // Keep the largest problems small in batch and heads.
      const bool big = sq * sk >= 1000 * 127;
      const int64_t hkv = big ? 1 : 2, hq = gqa ? hkv * (big ? 2 : 3) : hkv;
      cases.push_back({big ? 1 : b, hq, hkv, sq, sk, d, static_cast<MaskKind>(m)});
    }
  }
  // A head's K and V past 1 MiB (S_k * D > 2^17 floats): the forward's tasks take four query
  // blocks (at one thread), the last group a single partial block, each key block shared.
  for (MaskKind m : {MaskKind::kNone, MaskKind::kCausalBottomRight, MaskKind::kWindow,
                     MaskKind::kDocuments, MaskKind::kDropout}) {
    cases.push_back({1, 2, 1, 300, 1100, 128, m, CpuIsa::kAuto, 1});
  }
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kScalar}) {
    for (int m = 0; m < kinds; m += 2) {
      cases.push_back({2, 4, 2, 127, 64 + 16 * (m % 3), 80, static_cast<MaskKind>(m), isa});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashCpuSweepTest, ::testing::ValuesIn(sweep_cases()), case_name);

TEST(FlashCpuTest, ArbitraryStridesAndBlockSizes) {
  // q laid out as (B, S, H, D) and read through (B, H, S, D) strides; v with D strided by 2.
  const int64_t B = 2, H = 3, S = 45, D = 24;
  Buffer q_bshd(DType::kF32, B, S, H, D), k(DType::kF32, B, H, S, D),
      v_wide(DType::kF32, B, H, S, 2 * D), dout(DType::kF32, B, H, S, D);
  fill_normal(q_bshd, 5);
  fill_normal(k, 6);
  fill_normal(v_wide, 7);
  fill_normal(dout, 8);
  AttentionProblem p;
  p.q = q_bshd.view();
  p.q.sizes[1] = H, p.q.sizes[2] = S;
  p.q.strides[1] = D, p.q.strides[2] = H * D;
  p.k = k.view();
  p.v = v_wide.view();
  p.v.sizes[3] = D;
  p.v.strides[3] = 2;
  p.mask.causal = true;
  p.scale = 0.3;
  Buffer out_ref(DType::kF32, B, H, S, D), out = out_ref;
  Buffer dq_ref = out_ref, dq = out_ref, dk_ref = k, dk = k, dv_ref = k, dv = k;
  const MathOptions f64{.f64_accumulate = true};
  math_attention_forward(p, out_ref.view(), nullptr, f64);
  math_attention_backward(p, dout.view(), dq_ref.view(), dk_ref.view(), dv_ref.view(), f64);
  std::vector<float> lse(B * H * S);
  const FlashCpuOptions opts{.threads = 3, .block_q = 5, .block_kv = 16};
  flash_cpu_forward(p, out.view(), lse.data(), opts);
  flash_cpu_backward(p, out.view(), dout.view(), lse.data(), dq.view(), dk.view(), dv.view(), opts);
  EXPECT_LE(max_abs_diff(out.values(), out_ref.values()), 1e-5);
  EXPECT_LE(max_abs_diff(dq.values(), dq_ref.values()), 1e-4);
  EXPECT_LE(max_abs_diff(dk.values(), dk_ref.values()), 1e-4);
  EXPECT_LE(max_abs_diff(dv.values(), dv_ref.values()), 1e-4);
}

TEST(FlashCpuTest, StridedOutputAndUnalignedHeadDimOnEveryIsa) {
  // D = 40 is not a multiple of the 16-float tiles (whole and partial transpose blocks); the
  // output is written through a D stride of 2, then read back; 100 queries leave a partial
  // last query block.
  const int64_t B = 1, H = 2, S = 100, D = 40;
  Buffer q(DType::kF32, B, H, S, D), k = q, v = q;
  fill_normal(q, 11);
  fill_normal(k, 12);
  fill_normal(v, 13);
  AttentionProblem p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  p.mask.causal = true;
  Buffer out_ref = q;
  std::vector<float> lse_ref(B * H * S);
  math_attention_forward(p, out_ref.view(), lse_ref.data(), MathOptions{.f64_accumulate = true});
  for (CpuIsa isa : {CpuIsa::kAmx, CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (!cpu_isa_supported(isa)) continue;
    Buffer wide(DType::kF32, B, H, S, 2 * D);
    AttentionView out = wide.view();
    out.sizes[3] = D;
    out.strides[3] = 2;
    std::vector<float> lse(lse_ref.size());
    flash_cpu_forward(p, out, lse.data(), FlashCpuOptions{.isa = isa});
    double err = 0, lse_err = 0;
    for (int64_t r = 0; r < B * H * S; ++r) {
      for (int64_t c = 0; c < D; ++c) {
        const double got = wide.f32[r * 2 * D + 2 * c];
        err = std::max(err, std::fabs(got - out_ref.f32[r * D + c]));
        ASSERT_EQ(wide.f32[r * 2 * D + 2 * c + 1], 0.0f) << "wrote between strided elements";
      }
      lse_err = std::max(lse_err, std::fabs(double(lse[r]) - lse_ref[r]));
    }
    EXPECT_LE(err, 1e-5) << cpu_isa_name(isa);
    EXPECT_LE(lse_err, 1e-4) << cpu_isa_name(isa);
  }
}

TEST(FlashCpuTest, EmptyKeysGiveZeroOutput) {
  Buffer q(DType::kF32, 1, 2, 5, 16), k(DType::kF32, 1, 1, 0, 16), v = k;
  fill_normal(q, 9);
  AttentionProblem p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  Buffer out = q;
  fill_normal(out, 10);
  std::vector<float> lse(10, 0.0f);
  flash_cpu_forward(p, out.view(), lse.data());
  EXPECT_EQ(max_abs(out.values()), 0.0);
  for (float x : lse) EXPECT_EQ(x, -INFINITY);
}

}  // namespace
}  // namespace tessel::kernels::attention
