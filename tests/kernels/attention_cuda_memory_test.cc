// Long sequences on the GPU (label gpu; skips without a device): at S = 16,384 forward and
// backward through flash_cuda and cuDNN need memory linear in S — the allocator's peak grows by
// the outputs, gradients and O(S) scratch only (one S x S bf16 matrix per head would be 512 MiB)
// — and sampled rows of the output match a direct f64 computation.

#include <gtest/gtest.h>

#include <cmath>

#include "attention_cuda_test_util.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/storage.h"

namespace tessel::kernels {
namespace {

using attention::testing::kGpu;
using attention::testing::on_gpu;

void long_sequence(SdpaBackend backend) {
  const int64_t B = 1, H = 4, S = 16384, D = 128;
  Generator gen(7);
  const Tensor q_cpu = attention::testing::rounded(randn({B, H, S, D}, gen), DType::kBF16);
  const Tensor k_cpu = attention::testing::rounded(randn({B, H, S, D}, gen), DType::kBF16);
  const Tensor v_cpu = attention::testing::rounded(randn({B, H, S, D}, gen), DType::kBF16);
  const Tensor q = on_gpu(q_cpu, DType::kBF16).set_requires_grad(true);
  const Tensor k = on_gpu(k_cpu, DType::kBF16).set_requires_grad(true);
  const Tensor v = on_gpu(v_cpu, DType::kBF16).set_requires_grad(true);
  const Tensor g = on_gpu(randn({B, H, S, D}, gen), DType::kBF16);
  if (backend == SdpaBackend::kCudnn) {  // a configuration cuDNN declines skips with its reason
    attention::AttentionProblem p;
    p.q = p.k = p.v = attention::testing::view_of(q);
    p.mask.causal = true;
    const std::string why = attention::cudnn_sdpa_unsupported_reason(p);
    if (!why.empty()) GTEST_SKIP() << "cuDNN declines it: " << why;
  }
  synchronize(kGpu);
  reset_peak_memory_stats(kGpu);
  const int64_t before = memory_stats(kGpu).allocated_bytes;
  SdpaOptions opts;
  opts.causal = true;
  opts.backend = backend;
  const SdpaOutput r = scaled_dot_product_attention(q, k, v, opts);
  backward(sum(mul(r.output, g)));
  synchronize(kGpu);
  const int64_t peak = memory_stats(kGpu).peak_allocated_bytes - before;
  // out, the three gradients, the output-gradient product and logsumexp: 6 tensors of
  // B H S D bf16 (16 MiB each here) plus f32 rows; flash_cuda's dQ accumulator is f32 B H S D.
  const int64_t tensor_bytes = B * H * S * D * 2;
  EXPECT_LE(peak, 10 * tensor_bytes + (int64_t{64} << 20))
      << "peak growth " << (peak >> 20) << " MiB for " << sdpa_backend_name(backend);

  // Rows of the output against f64 sums over the visible keys.
  const std::vector<float> out = attention::testing::values(r.output);
  const std::vector<float> qv = to_vector<float>(q_cpu), kv = to_vector<float>(k_cpu);
  const std::vector<float> vv = to_vector<float>(v_cpu);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (const int64_t i : {int64_t{0}, int64_t{1}, int64_t{4097}, S - 1}) {
    const int64_t h = i % H;
    std::vector<double> s(i + 1);
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d)
        dot += double(qv[(h * S + i) * D + d]) * kv[(h * S + j) * D + d];
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    for (double& x : s) sum += (x = std::exp(x - m));
    for (int64_t d = 0; d < D; ++d) {
      double o = 0;
      for (int64_t j = 0; j <= i; ++j) o += s[j] / sum * vv[(h * S + j) * D + d];
      EXPECT_NEAR(out[(h * S + i) * D + d], o, 2e-2) << "row " << i << " d " << d;
    }
  }
}

TEST(SdpaCudaMemoryTest, FlashCudaAt16kIsLinearInS) {
  TESSEL_SKIP_WITHOUT_CUDA();
  long_sequence(SdpaBackend::kFlashCuda);
}

TEST(SdpaCudaMemoryTest, CudnnAt16kIsLinearInS) {
  TESSEL_SKIP_WITHOUT_CUDA();
  if (!attention::cudnn_sdpa_is_available()) GTEST_SKIP() << "tessel was built without cuDNN";
  long_sequence(SdpaBackend::kCudnn);
}

}  // namespace
}  // namespace tessel::kernels
