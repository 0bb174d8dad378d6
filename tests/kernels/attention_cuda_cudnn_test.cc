// The cuDNN backend on the GPU (label gpu; skips without a device or cuDNN): forward,
// logsumexp and all three gradients against the f32 math reference on the GPU, by
// FlashAttention's rule for bf16, over head dims, lengths, GQA and the masks cuDNN runs (none,
// causal in both alignments, sliding windows with a right bound); the deterministic backward is
// bitwise reproducible; the masks it declines are declined with a reason that names what it
// supports, so that forcing it fails clearly and the dispatcher moves on; configurations cuDNN
// declines on the device at hand (its graphs' support check) skip with cuDNN's reason.

#include <gtest/gtest.h>

#include "attention_cuda_test_util.h"

namespace tessel::kernels::attention {
namespace {

using testing::Inputs;
using testing::KernelCase;
using testing::MaskKind;
using testing::Results;
using testing::Which;

std::string cudnn_unusable_reason() {
  std::string why = testing::cuda_unusable_reason();
  if (why.empty() && !cudnn_sdpa_is_available()) why = "tessel was built without cuDNN";
  if (why.empty() && cuda_compute_capability(0) < 80) why = "cuDNN attention needs sm_80";
  return why;
}

class CudnnSdpaTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(CudnnSdpaTest, MatchesF32Math) {
  const std::string why = cudnn_unusable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const KernelCase& c = GetParam();
  const Inputs in(c);
  const Results ref = testing::run(Which::kMathCuda, in, DType::kF32);
  const std::vector<double> bound = testing::bounds(in, c.dtype, ref);
  // A configuration cuDNN declines (the dispatcher runs flash_cuda for it) skips with the reason.
  const Results r = testing::run(Which::kCudnn, in, c.dtype);
  if (!r.declined.empty()) GTEST_SKIP() << "cuDNN declines it: " << r.declined;
  testing::expect_within(r, ref, bound, "cudnn");
  const Results det1 = testing::run(Which::kCudnn, in, c.dtype, /*deterministic=*/true);
  if (!det1.declined.empty())
    GTEST_SKIP() << "cuDNN declines the deterministic backward: " << det1.declined;
  const Results det2 = testing::run(Which::kCudnn, in, c.dtype, /*deterministic=*/true);
  testing::expect_within(det1, ref, bound, "cudnn deterministic");
  EXPECT_EQ(det1.dq, det2.dq);
  EXPECT_EQ(det1.dk, det2.dk);
  EXPECT_EQ(det1.dv, det2.dv);
}

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  for (MaskKind m : {MaskKind::kNone, MaskKind::kCausalTopLeft, MaskKind::kCausalBottomRight,
                     MaskKind::kWindowBottomRight}) {
    out.push_back({DType::kBF16, 2, 4, 2, 129, 257, 64, m});
    out.push_back({DType::kF16, 1, 4, 1, 256, 256, 128, m});
  }
  out.push_back({DType::kBF16, 1, 1, 1, 1, 1, 64, MaskKind::kNone});
  out.push_back({DType::kBF16, 3, 2, 2, 7, 13, 32, MaskKind::kCausalTopLeft});
  out.push_back({DType::kBF16, 1, 2, 2, 2048, 2048, 128, MaskKind::kCausalTopLeft});
  out.push_back({DType::kF16, 1, 2, 2, 1, 4096, 128, MaskKind::kCausalBottomRight});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CudnnSdpaTest, ::testing::ValuesIn(cases()),
                         testing::kernel_case_name);

TEST(CudnnSdpaTest, DeclinedMasksNameWhatCudnnSupports) {
  const std::string why = cudnn_unusable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  Generator gen(1);
  const Tensor q = testing::on_gpu(randn({1, 2, 64, 64}, gen), DType::kBF16);
  AttentionProblem p;
  p.q = p.k = p.v = testing::view_of(q);
  EXPECT_EQ(cudnn_sdpa_unsupported_reason(p), "");
  auto reason_with = [&](auto&& change) {
    AttentionProblem c = p;
    change(c);
    return cudnn_sdpa_unsupported_reason(c);
  };
  EXPECT_NE(reason_with([](AttentionProblem& c) {
              c.mask.q_document_ids.assign(64, 0);
            }).find("cudnn supports causal masks and sliding windows"),
            std::string::npos);
  EXPECT_NE(reason_with([](AttentionProblem& c) {
              c.dropout = {0.1, 1, 2};
            }).find("dropout"),
            std::string::npos);
  EXPECT_NE(reason_with([](AttentionProblem& c) {
              c.mask.window_left = 8;
            }).find("needs causal or window_right"),
            std::string::npos);
  const Tensor f32 = testing::on_gpu(randn({1, 2, 64, 64}, gen), DType::kF32);
  EXPECT_NE(reason_with([&](AttentionProblem& c) {
              c.q = c.k = c.v = testing::view_of(f32);
            }).find("cudnn supports bf16 and f16"),
            std::string::npos);
  const Tensor wide = testing::on_gpu(randn({1, 2, 64, 256}, gen), DType::kBF16);
  EXPECT_NE(reason_with([&](AttentionProblem& c) {
              c.q = c.k = c.v = testing::view_of(wide);
            }).find("head dims 8 to 128"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel::kernels::attention
