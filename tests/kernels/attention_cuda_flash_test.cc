// flash_cuda and the math backend on the GPU (label gpu; skips without a device): forward,
// logsumexp and all three gradients against the f32 math reference computed on the GPU, and
// against the CPU flash backend, over head dims 32/64/80/128, lengths 1, odd and long, GQA and
// MQA, and every mask kind (causal both alignments, windows, prefix-LM, documents, predicates,
// fully masked rows, dropout). bf16 by FlashAttention's rule: at most twice the error of plain
// bf16 attention (the CPU math backend rounding its intermediates to bf16) against the f32
// reference. The deterministic backward is bitwise reproducible.

#include <gtest/gtest.h>

#include "attention_cuda_test_util.h"

namespace tessel::kernels::attention {
namespace {

using testing::bounds;
using testing::expect_within;
using testing::Inputs;
using testing::KernelCase;
using testing::MaskKind;
using testing::Results;
using testing::run;
using testing::Which;

class FlashCudaTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FlashCudaTest, EveryGpuBackendMatchesF32MathAndFlashCpu) {
  TESSEL_SKIP_WITHOUT_CUDA();
  const KernelCase& c = GetParam();
  const Inputs in(c);
  const Results ref = run(Which::kMathCuda, in, DType::kF32);  // the f32 reference, on the GPU
  const std::vector<double> bound = bounds(in, c.dtype, ref);

  const Results flash = run(Which::kFlashCuda, in, c.dtype);
  expect_within(flash, ref, bound, "flash_cuda");
  const Results flash_det = run(Which::kFlashCuda, in, c.dtype, /*deterministic=*/true);
  expect_within(flash_det, ref, bound, "flash_cuda deterministic");
  const Results math16 = run(Which::kMathCuda, in, c.dtype);
  expect_within(math16, ref, bound, "math on cuda");

  if (c.dtype == DType::kBF16) {  // flash_cpu has no f16
    const Results cpu = run(Which::kFlashCpu, in, DType::kBF16);
    std::vector<double> both(4);
    for (int t = 0; t < 4; ++t) both[t] = 2 * bound[t];
    expect_within(flash, cpu, both, "flash_cuda vs flash_cpu");
  }
}

TEST_P(FlashCudaTest, DeterministicBackwardIsBitwiseReproducible) {
  TESSEL_SKIP_WITHOUT_CUDA();
  const KernelCase& c = GetParam();
  if (c.sq * c.sk > 300 * 300) GTEST_SKIP() << "covered by the smaller cases";
  const Inputs in(c);
  const Results a = run(Which::kFlashCuda, in, c.dtype, true);
  const Results b = run(Which::kFlashCuda, in, c.dtype, true);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  // Every mask kind in both configurations (GQA with S_q < S_k; MQA with S_q > S_k).
  for (int m = 0; m < static_cast<int>(MaskKind::kCount); ++m) {
    const auto mask = static_cast<MaskKind>(m);
    out.push_back({DType::kBF16, 2, 4, 2, 129, 257, 64, mask});
    out.push_back({DType::kF16, 1, 2, 1, 257, 129, 128, mask});
  }
  // Lengths 1, odd and long; padded head dims; decoding (one query, bottom-right).
  out.push_back({DType::kBF16, 1, 1, 1, 1, 1, 64, MaskKind::kNone});
  out.push_back({DType::kBF16, 3, 2, 2, 7, 13, 32, MaskKind::kCausalTopLeft});
  out.push_back({DType::kF16, 1, 3, 3, 77, 77, 80, MaskKind::kDocuments});
  out.push_back({DType::kBF16, 1, 2, 2, 1000, 1000, 128, MaskKind::kCausalTopLeft});
  out.push_back({DType::kBF16, 1, 2, 1, 2048, 2048, 64, MaskKind::kWindow});
  out.push_back({DType::kBF16, 2, 4, 1, 1, 4096, 128, MaskKind::kCausalBottomRight});
  out.push_back({DType::kF16, 1, 2, 2, 1531, 1531, 128, MaskKind::kNone});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashCudaTest, ::testing::ValuesIn(cases()),
                         testing::kernel_case_name);

}  // namespace
}  // namespace tessel::kernels::attention
