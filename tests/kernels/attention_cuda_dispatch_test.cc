// The dispatcher with the CUDA backends built in (runs everywhere, no GPU): forcing flash_cuda
// or cudnn on CPU tensors fails with a message that names what they run; f16 on the CPU falls
// back to the math backend (flash_cpu declines it); the choice is logged under
// TESSEL_LOGS=kernels=debug with the reasons the others were passed over.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_cuda_test_util.h"

namespace tessel::kernels {
namespace {

using attention::testing::debug_log;

// Forcing `forced` on CPU tensors of `dtype`.
std::string error_of(SdpaBackend forced, DType dtype) {
  Generator gen(1);
  return attention::testing::forced_error(forced, to(randn({1, 2, 8, 16}, gen), dtype));
}

TEST(SdpaCudaDispatchTest, ForcedGpuBackendsOnCpuTensorsSayWhatTheyRun) {
  const std::string flash = error_of(SdpaBackend::kFlashCuda, DType::kBF16);
  if (attention::flash_cuda_is_available()) {
    EXPECT_NE(flash.find("flash_cuda: tensors are on cpu; flash_cuda runs CUDA tensors"),
              std::string::npos)
        << flash;
  } else {
    EXPECT_NE(flash.find("flash_cuda: not built into this binary"), std::string::npos) << flash;
  }
  const std::string cudnn = error_of(SdpaBackend::kCudnn, DType::kBF16);
  if (attention::cudnn_sdpa_is_available()) {
    EXPECT_NE(cudnn.find("cudnn: tensors are on cpu; cudnn runs CUDA tensors"), std::string::npos)
        << cudnn;
  } else {
    EXPECT_NE(cudnn.find("cudnn: not built into this binary"), std::string::npos) << cudnn;
  }
}

TEST(SdpaCudaDispatchTest, F16OnTheCpuRunsOnMathAndMatchesF32) {
  Generator gen(2);
  const Tensor q = randn({2, 2, 9, 16}, gen), k = randn({2, 1, 11, 16}, gen);
  const Tensor v = randn({2, 1, 11, 16}, gen);
  auto h = [](const Tensor& t) { return to(t, DType::kF16); };
  SdpaOptions opts;
  opts.causal = true;
  opts.alignment = attention::MaskAlignment::kBottomRight;
  const SdpaOutput r16 = scaled_dot_product_attention(h(q), h(k), h(v), opts);
  EXPECT_EQ(r16.backend, SdpaBackend::kMath);
  EXPECT_EQ(r16.output.dtype(), DType::kF16);
  const SdpaOutput r32 = scaled_dot_product_attention(to(h(q), DType::kF32), to(h(k), DType::kF32),
                                                      to(h(v), DType::kF32), opts);
  const double diff = item(max(abs(sub(to(r16.output, DType::kF32), r32.output))));
  EXPECT_LE(diff, 2e-3);  // one f16 rounding of the output
}

TEST(SdpaCudaDispatchTest, ChoiceIsLoggedAtDebug) {
  Generator gen(3);
  const Tensor q = to(randn({1, 1, 4, 8}, gen), DType::kF16);
  SdpaOptions opts;
  opts.causal = true;
  const std::vector<std::string> lines =
      debug_log([&] { scaled_dot_product_attention(q, q, q, opts); });
  ASSERT_FALSE(lines.empty());
  const std::string& line = lines.back();
  EXPECT_NE(line.find("scaled_dot_product_attention: math for f16 q (1, 1, 4, 8)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("causal on cpu"), std::string::npos) << line;
  EXPECT_NE(line.find("flash_cpu: dtype f16; flash_cpu supports f32 and bf16"), std::string::npos)
      << line;
}

}  // namespace
}  // namespace tessel::kernels
