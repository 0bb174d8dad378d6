// The GPT on CUDA against the same GPT on the CPU: loss and every parameter gradient after one
// forward/backward, in f32 and in bf16, with and without dropout (whose masks are equal on both
// devices), a few AdamW steps of training, and the plain attention the math backend runs on
// CUDA. Skips with the reason where the process sees no CUDA device.
//
// Tolerances (the two devices run different GEMM libraries and sum in different orders):
// - f32 (TF32 off): loss within 2e-5 relative; each gradient within 5e-4 of the CPU's in
//   relative L2 norm; losses of the training steps within 1e-4 relative.
// - bf16 parameters and activations on both devices: loss within 1e-2 relative, gradients
//   within 5e-2 in relative L2 norm (bf16 keeps 8 bits; results round differently).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>

#include "tessel/kernels/attention/sdpa.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

#define TESSEL_REQUIRE_CUDA()                                           \
  do {                                                                  \
    if (cuda::device_count() == 0) {                                    \
      GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason(); \
    }                                                                   \
  } while (0)

const Device kGpu = Device::cuda(0);

nn::GptConfig small_config(double dropout) {
  return {.vocab_size = 320,
          .block_size = 64,
          .n_layer = 2,
          .n_head = 4,
          .n_embd = 128,
          .dropout = dropout,
          .seed = 5};
}

std::pair<Tensor, Tensor> batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<int64_t> x(B * T), y(B * T);
  for (auto& v : x) v = token(rng);
  for (auto& v : y) v = token(rng);
  return {from_vector<int64_t>(x, {B, T}), from_vector<int64_t>(y, {B, T})};
}

struct Result {
  double loss = 0;
  std::map<std::string, Tensor> grads;  // on the CPU, f32
};

// One forward/backward of a fresh model (CPU initialisation) moved to `device` in `dtype`.
Result run(Device device, DType dtype, const nn::GptConfig& config, bool autocast = false) {
  nn::GPT model(config);
  model.to(dtype);
  model.to(device);
  const auto [x, y] = batch(4, config.block_size, config.vocab_size, 9);
  Tensor loss;
  {
    AutocastGuard guard(DType::kBF16, autocast);
    loss = nn::GPT::loss(model(to(x, device)), to(y, device));
  }
  backward(loss);
  Result r;
  r.loss = item(loss);
  for (auto& [name, p] : model.named_parameters()) {
    r.grads[name] = to(to(p.grad(), Device::cpu()), DType::kF32);
  }
  return r;
}

double norm(const Tensor& t) { return std::sqrt(item(sum(mul(t, t)))); }

void expect_close(const Result& gpu, const Result& cpu, double loss_rtol, double grad_rtol) {
  EXPECT_NEAR(gpu.loss, cpu.loss, loss_rtol * std::fabs(cpu.loss));
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (const auto& [name, g] : cpu.grads) {
    const double diff = norm(sub(gpu.grads.at(name), g)), size = norm(g);
    EXPECT_LE(diff, grad_rtol * size + 1e-12)
        << name << ": |gpu - cpu| " << diff << ", |cpu| " << size;
  }
}

TEST(CudaGptTest, LossAndGradientsMatchTheCpuInF32) {
  TESSEL_REQUIRE_CUDA();
  ASSERT_FALSE(cuda::matmul_allow_tf32());
  expect_close(run(kGpu, DType::kF32, small_config(0.0)),
               run(Device::cpu(), DType::kF32, small_config(0.0)), 2e-5, 5e-4);
}

TEST(CudaGptTest, DropoutMasksAreTheSameOnBothDevices) {
  TESSEL_REQUIRE_CUDA();
  // Equal masks keep the f32 tolerance; different masks would move the loss by far more.
  expect_close(run(kGpu, DType::kF32, small_config(0.1)),
               run(Device::cpu(), DType::kF32, small_config(0.1)), 2e-5, 5e-4);
}

TEST(CudaGptTest, LossAndGradientsMatchTheCpuInBf16) {
  TESSEL_REQUIRE_CUDA();
  expect_close(run(kGpu, DType::kBF16, small_config(0.0)),
               run(Device::cpu(), DType::kBF16, small_config(0.0)), 1e-2, 5e-2);
}

TEST(CudaGptTest, MixedPrecisionUnderAutocastMatchesTheCpu) {
  TESSEL_REQUIRE_CUDA();
  expect_close(run(kGpu, DType::kF32, small_config(0.0), true),
               run(Device::cpu(), DType::kF32, small_config(0.0), true), 1e-2, 5e-2);
}

TEST(CudaGptTest, TrainingStepsFollowTheCpu) {
  TESSEL_REQUIRE_CUDA();
  auto train = [](Device device) {
    nn::GPT model(small_config(0.0));
    model.to(device);
    nn::optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.1});
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      const auto [x, y] = batch(4, 64, 320, 100 + step);
      const Tensor loss = nn::GPT::loss(model(to(x, device)), to(y, device));
      backward(loss);
      opt.step();
      opt.zero_grad();
      losses.push_back(item(loss));
    }
    return losses;
  };
  const std::vector<double> gpu = train(kGpu), cpu = train(Device::cpu());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "step " << i;
}

TEST(CudaGptTest, PlainAttentionOnCudaMatchesTheCpu) {
  TESSEL_REQUIRE_CUDA();
  Generator gen(2);
  const Tensor q = randn({2, 4, 48, 32}, gen), k = randn({2, 4, 48, 32}, gen),
               v = randn({2, 4, 48, 32}, gen), g = randn({2, 4, 48, 32}, gen);
  kernels::SdpaOptions opts;
  opts.causal = true;
  auto run_on = [&](Device device) {
    Tensor qd = to(q, device).set_requires_grad(true), kd = to(k, device).set_requires_grad(true),
           vd = to(v, device).set_requires_grad(true);
    const kernels::SdpaOutput r = kernels::scaled_dot_product_attention(qd, kd, vd, opts);
    backward(sum(mul(r.output, to(g, device))));
    return std::vector<Tensor>{to(r.output, Device::cpu()), to(r.logsumexp, Device::cpu()),
                               to(qd.grad(), Device::cpu()), to(kd.grad(), Device::cpu()),
                               to(vd.grad(), Device::cpu())};
  };
  const auto gpu = run_on(kGpu), cpu = run_on(Device::cpu());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_LT(item(max(abs(sub(gpu[i], cpu[i])))), 1e-4) << "output " << i;
  }
}

}  // namespace
}  // namespace tessel
