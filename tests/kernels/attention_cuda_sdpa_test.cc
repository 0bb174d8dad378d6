// scaled_dot_product_attention on CUDA tensors (label gpu; skips without a device): the
// dispatcher's choice (cuDNN on sm_90 where it runs the call, flash_cuda otherwise, math as the
// last resort) and its debug log; autograd through the entry point against the same call on the
// CPU, with GQA and a (B, S, H, D) layout read in place; forcing per call and by scope, and the
// errors of forced backends that cannot run a call; the GPT on CUDA running its attention on the
// fused kernels.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention_cuda_test_util.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/nn/gpt.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"

namespace tessel::kernels {
namespace {

using attention::testing::debug_log;
using attention::testing::forced_error;
using attention::testing::kGpu;
using attention::testing::on_cpu_f32;
using attention::testing::on_gpu;

SdpaBackend expected_default() {
  return attention::cudnn_sdpa_is_available() && attention::cuda_compute_capability(0) >= 90
             ? SdpaBackend::kCudnn
             : SdpaBackend::kFlashCuda;
}

TEST(SdpaCudaTest, DispatchPicksByArchitectureAndLogsIt) {
  TESSEL_SKIP_WITHOUT_CUDA();
  Generator gen(1);
  const Tensor q = on_gpu(randn({2, 4, 256, 64}, gen), DType::kBF16);
  SdpaOptions opts;
  opts.causal = true;
  SdpaOutput r;
  const std::vector<std::string> lines =
      debug_log([&] { r = scaled_dot_product_attention(q, q, q, opts); });
  EXPECT_EQ(r.backend, expected_default());
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(
      lines.back().find(std::string(sdpa_backend_name(r.backend)) + " for bf16 q (2, 4, 256, 64)"),
      std::string::npos)
      << lines.back();
  // Documents: cuDNN declines them, flash_cuda runs them.
  opts.document_ids = from_vector<int64_t>(std::vector<int64_t>(256, 0), {256});
  EXPECT_EQ(scaled_dot_product_attention(q, q, q, opts).backend, SdpaBackend::kFlashCuda);
  // f32: neither fused backend; math on the GPU, silently.
  const Tensor q32 = on_gpu(randn({1, 2, 33, 16}, gen), DType::kF32);
  EXPECT_EQ(scaled_dot_product_attention(q32, q32, q32).backend, SdpaBackend::kMath);
}

TEST(SdpaCudaTest, GradientsMatchTheCpuWithGqaAndStrides) {
  TESSEL_SKIP_WITHOUT_CUDA();
  Generator gen(2);
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 77, D = 64;
  // q stored as (B, S, H, D) and viewed as (B, H, S, D).
  const Tensor q_bshd = randn({B, S, Hq, D}, gen), k_cpu = randn({B, Hkv, S, D}, gen);
  const Tensor v_cpu = randn({B, Hkv, S, D}, gen), g_cpu = randn({B, Hq, S, D}, gen);
  auto leaf = [](const Tensor& t) {
    Tensor d = detach(t);
    d.set_requires_grad(true);
    return d;
  };
  const Tensor qg = leaf(permute(on_gpu(q_bshd, DType::kBF16), {0, 2, 1, 3}));
  const Tensor kg = leaf(on_gpu(k_cpu, DType::kBF16)), vg = leaf(on_gpu(v_cpu, DType::kBF16));
  const Tensor qc = leaf(permute(to(q_bshd, DType::kBF16), {0, 2, 1, 3}));
  const Tensor kc = leaf(to(k_cpu, DType::kBF16)), vc = leaf(to(v_cpu, DType::kBF16));
  SdpaOptions opts;
  opts.causal = true;
  opts.window_left = 20;
  const SdpaOutput rg = scaled_dot_product_attention(qg, kg, vg, opts);
  const SdpaOutput rc = scaled_dot_product_attention(qc, kc, vc, opts);
  backward(sum(mul(rg.output, on_gpu(g_cpu, DType::kBF16))));
  backward(sum(mul(rc.output, to(g_cpu, DType::kBF16))));
  auto diff = [](const Tensor& a, const Tensor& b) {
    return item(max(abs(sub(on_cpu_f32(a), on_cpu_f32(b)))));
  };
  EXPECT_LE(diff(rg.output, rc.output), 2e-2);
  EXPECT_LE(diff(rg.logsumexp, rc.logsumexp), 1e-2);
  EXPECT_LE(diff(qg.grad(), qc.grad()), 5e-2);
  EXPECT_LE(diff(kg.grad(), kc.grad()), 5e-2);
  EXPECT_LE(diff(vg.grad(), vc.grad()), 5e-2);
}

TEST(SdpaCudaTest, ForcedBackendsThatCannotRunACallSayWhatTheySupport) {
  TESSEL_SKIP_WITHOUT_CUDA();
  Generator gen(3);
  const Tensor f32 = on_gpu(randn({1, 2, 16, 64}, gen), DType::kF32);
  EXPECT_NE(forced_error(SdpaBackend::kFlashCuda, f32).find("flash_cuda supports bf16 and f16"),
            std::string::npos);
  const Tensor wide = on_gpu(randn({1, 2, 16, 256}, gen), DType::kBF16);
  EXPECT_NE(forced_error(SdpaBackend::kFlashCuda, wide).find("head dims 8 to 128"),
            std::string::npos);
  if (attention::cudnn_sdpa_is_available()) {
    EXPECT_NE(forced_error(SdpaBackend::kCudnn, wide).find("head dims 8 to 128"),
              std::string::npos);
    SdpaOptions fn;
    fn.mask_fn = [](int64_t, int64_t, int64_t i, int64_t j) { return (i + j) % 2 == 0; };
    const Tensor q = on_gpu(randn({1, 2, 16, 64}, gen), DType::kBF16);
    EXPECT_NE(forced_error(SdpaBackend::kCudnn, q, fn).find("flash_cuda runs the rest"),
              std::string::npos);
  }
  EXPECT_NE(forced_error(SdpaBackend::kFlashCpu, f32).find("tensors are on cuda:0"),
            std::string::npos);
  // A scope forces as well; the math backend runs anything on the GPU.
  SdpaBackendScope only_math(SdpaBackend::kMath);
  EXPECT_EQ(scaled_dot_product_attention(wide, wide, wide).backend, SdpaBackend::kMath);
}

// Where the dispatcher picks cudnn (sm_90): an inference call builds a forward graph and no
// backward one; the first backward builds the backward graph; a deterministic backward whose
// S_q x S_k workspace cuDNN would need exceeds the limit runs on flash_cuda, recorded, without
// an error, and is bitwise reproducible.
TEST(SdpaCudaTest, CudnnBuildsGraphsPerDirectionAndFallsBackInBackward) {
  TESSEL_SKIP_WITHOUT_CUDA();
  if (expected_default() != SdpaBackend::kCudnn) GTEST_SKIP() << "cudnn is not the default here";
  using attention::SdpaDirection;
  Generator gen(4);
  auto leaf = [&](const Shape& shape) {
    Tensor t = on_gpu(randn(shape, gen), DType::kBF16);
    t.set_requires_grad(true);
    return t;
  };
  SdpaOptions opts;
  opts.causal = true;
  {
    const Tensor q = on_gpu(randn({1, 2, 200, 64}, gen), DType::kBF16);  // a shape of its own
    const int64_t fwd = attention::cudnn_sdpa_graph_builds(SdpaDirection::kForward);
    const int64_t bwd = attention::cudnn_sdpa_graph_builds(SdpaDirection::kBackward);
    EXPECT_EQ(scaled_dot_product_attention(q, q, q, opts).backend, SdpaBackend::kCudnn);
    EXPECT_EQ(attention::cudnn_sdpa_graph_builds(SdpaDirection::kForward), fwd + 1);
    EXPECT_EQ(attention::cudnn_sdpa_graph_builds(SdpaDirection::kBackward), bwd)
        << "an inference call built a backward graph";
    const Tensor qg = leaf({1, 2, 200, 64});
    backward(sum(scaled_dot_product_attention(qg, qg, qg, opts).output));
    EXPECT_EQ(attention::cudnn_sdpa_graph_builds(SdpaDirection::kBackward), bwd + 1);
  }
  // B 1, H 16, S 8192: cuDNN's deterministic workspace would be 2 GiB.
  opts.deterministic = true;
  const Tensor q = leaf({1, 16, 8192, 64}), k = leaf({1, 16, 8192, 64}),
               v = leaf({1, 16, 8192, 64});
  std::vector<Tensor> grads[2];
  for (auto& g : grads) {
    for (const Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
    const SdpaOutput r = scaled_dot_product_attention(q, k, v, opts);
    EXPECT_EQ(r.backend, SdpaBackend::kCudnn);
    backward(sum(r.output));
    g = {on_cpu_f32(q.grad()), on_cpu_f32(k.grad()), on_cpu_f32(v.grad())};
  }
  bool recorded = false;
  for (const attention::CudnnFallback& f : attention::cudnn_sdpa_fallbacks()) {
    recorded |= f.direction == SdpaDirection::kBackward &&
                f.reason.find("deterministic backward") != std::string::npos;
  }
  EXPECT_TRUE(recorded);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(to_vector<float>(grads[0][t]), to_vector<float>(grads[1][t])) << "gradient " << t;
  }
}

// A bf16 model, and an f32 model under bf16 autocast (as train_gpt runs on CUDA): every layer's
// attention goes to a fused kernel, none to math.
TEST(SdpaCudaTest, GptOnCudaRunsItsAttentionOnTheFusedKernels) {
  TESSEL_SKIP_WITHOUT_CUDA();
  const nn::GptConfig config{
      .vocab_size = 64, .block_size = 128, .n_layer = 2, .n_head = 4, .n_embd = 256, .seed = 5};
  std::vector<int64_t> tokens(2 * 128);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 7 % 64);
  const Tensor x = to(from_vector<int64_t>(tokens, {2, 128}), kGpu);
  for (const bool bf16_model : {true, false}) {
    nn::GPT model(config);
    model.to(kGpu);
    if (bf16_model) model.to(DType::kBF16);
    const std::vector<std::string> lines = debug_log([&] {
      Tensor loss;
      {
        AutocastGuard autocast(DType::kBF16, /*enabled=*/!bf16_model);
        loss = nn::GPT::loss(model(x), x);
      }
      backward(loss);
      EXPECT_TRUE(std::isfinite(item(loss)));
    });
    int fused = 0;
    for (const std::string& line : lines) {
      if (line.find("scaled_dot_product_attention: ") == std::string::npos) continue;
      EXPECT_EQ(line.find("scaled_dot_product_attention: math"), std::string::npos) << line;
      // cudnn on sm_90 unless it declines the strided q, k, v of a bf16 model; flash_cuda else.
      EXPECT_TRUE(line.find("cudnn for bf16") != std::string::npos ||
                  line.find("flash_cuda for bf16") != std::string::npos)
          << line;
      ++fused;
    }
    EXPECT_EQ(fused, 2) << (bf16_model ? "bf16 model" : "f32 model under bf16 autocast");
  }
}

}  // namespace
}  // namespace tessel::kernels
