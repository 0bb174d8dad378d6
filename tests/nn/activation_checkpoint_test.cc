// Activation checkpointing (nn/activation_checkpoint.h): gradients bit-identical to training
// without it (CPU, f32) for the GPT and the Llama, full and selective, with dropout; and the
// peak memory of a 12-layer GPT's step with and without it.

#include "tessel/nn/activation_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/optim/sgd.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::nn {
namespace {

Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator gen(seed);
  return to(mul(rand({B, T}, gen), static_cast<double>(V) - 0.01), DType::kI64);
}

// Whether two f32 tensors hold the same bits.
bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector<float>(a), y = to_vector<float>(b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Trains `reference` and `checkpointed` (same weights) side by side for `steps` SGD steps on the
// same batches; every step's loss and every parameter's gradient must be bit-identical.
template <typename Model>
void expect_identical_training(Model& reference, Model& checkpointed, int64_t vocab, int steps) {
  optim::Sgd ref_opt(reference.parameters(), {.lr = 0.1});
  optim::Sgd ckpt_opt(checkpointed.parameters(), {.lr = 0.1});
  for (int step = 0; step < steps; ++step) {
    const Tensor tokens = random_tokens(2, 16, vocab, 10 + step);
    const Tensor targets = random_tokens(2, 16, vocab, 20 + step);
    const Tensor ref_loss = Model::loss(reference(tokens), targets);
    const Tensor ckpt_loss = Model::loss(checkpointed(tokens), targets);
    backward(ref_loss);
    backward(ckpt_loss);
    EXPECT_TRUE(same_bits(ref_loss, ckpt_loss))
        << "step " << step << ": loss " << to_vector<float>(ref_loss)[0] << " vs "
        << to_vector<float>(ckpt_loss)[0];
    const auto ref_params = reference.named_parameters();
    const auto ckpt_params = checkpointed.named_parameters();
    ASSERT_EQ(ref_params.size(), ckpt_params.size());
    for (size_t i = 0; i < ref_params.size(); ++i) {
      ASSERT_TRUE(ckpt_params[i].second.grad().defined()) << ckpt_params[i].first;
      EXPECT_TRUE(same_bits(ref_params[i].second.grad(), ckpt_params[i].second.grad()))
          << "step " << step << ": gradient of " << ref_params[i].first;
    }
    ref_opt.step();
    ckpt_opt.step();
    ref_opt.zero_grad();
    ckpt_opt.zero_grad();
  }
}

GptConfig small_gpt(double dropout) {
  return {.vocab_size = 64,
          .block_size = 32,
          .n_layer = 3,
          .n_head = 2,
          .n_embd = 32,
          .dropout = dropout,
          .seed = 5};
}

class CheckpointGptTest
    : public ::testing::TestWithParam<std::tuple<CheckpointPolicy, double /*dropout*/>> {};

TEST_P(CheckpointGptTest, GradientsBitIdenticalToNoCheckpointing) {
  const auto [policy, dropout] = GetParam();
  GPT reference(small_gpt(dropout));
  GPT checkpointed(small_gpt(dropout));
  EXPECT_EQ(checkpoint_blocks(checkpointed, policy), 3);
  expect_identical_training(reference, checkpointed, 64, /*steps=*/3);
}

INSTANTIATE_TEST_SUITE_P(Policies, CheckpointGptTest,
                         ::testing::Combine(::testing::Values(CheckpointPolicy::kFull,
                                                              CheckpointPolicy::kSelective),
                                            ::testing::Values(0.0, 0.1)),
                         [](const auto& info) {
                           return std::string(checkpoint_policy_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) > 0 ? "_Dropout" : "_NoDropout");
                         });

class CheckpointLlamaTest : public ::testing::TestWithParam<CheckpointPolicy> {};

TEST_P(CheckpointLlamaTest, GradientsBitIdenticalToNoCheckpointing) {
  Llama reference(LlamaConfig::tiny());
  Llama checkpointed(LlamaConfig::tiny());
  EXPECT_EQ(checkpoint_blocks(checkpointed, GetParam()), LlamaConfig::tiny().n_layers);
  expect_identical_training(reference, checkpointed, LlamaConfig::tiny().vocab_size, 2);
}

INSTANTIATE_TEST_SUITE_P(Policies, CheckpointLlamaTest,
                         ::testing::Values(CheckpointPolicy::kFull, CheckpointPolicy::kSelective),
                         [](const auto& info) {
                           return std::string(checkpoint_policy_name(info.param));
                         });

TEST(CheckpointTest, EvalAndNoGradRunThePlainForward) {
  GPT model(small_gpt(0.1));
  GPT reference(small_gpt(0.1));
  checkpoint_blocks(model, CheckpointPolicy::kFull);
  model.eval();
  reference.eval();
  const Tensor tokens = random_tokens(2, 8, 64, 1);
  NoGradGuard no_grad;
  EXPECT_TRUE(same_bits(model(tokens), reference(tokens)));
}

TEST(CheckpointTest, PolicyNamesRoundTrip) {
  for (auto p : {CheckpointPolicy::kNone, CheckpointPolicy::kFull, CheckpointPolicy::kSelective}) {
    EXPECT_EQ(parse_checkpoint_policy(checkpoint_policy_name(p)), p);
  }
  EXPECT_THROW(parse_checkpoint_policy("some"), InvalidArgument);
  Module plain("Plain");
  EXPECT_THROW(checkpoint_blocks(plain, CheckpointPolicy::kFull), InvalidArgument);
}

// ---- Memory ----------------------------------------------------------------------------------

constexpr int64_t kLayers = 12;
constexpr int64_t kBatch = 4, kSeq = 128;

GptConfig memory_gpt() {
  return {.vocab_size = 64,
          .block_size = kSeq,
          .n_layer = kLayers,
          .n_head = 4,
          .n_embd = 128,
          .seed = 3};
}

// Bytes one training step's activations take at their peak: the CPU allocator's peak during
// forward + backward above what was allocated before (weights and gradients, which exist from
// the warm-up step on; backward accumulates into them in place).
int64_t step_activation_bytes(CheckpointPolicy policy) {
  GPT model(memory_gpt());
  checkpoint_blocks(model, policy);
  const Tensor tokens = random_tokens(kBatch, kSeq, 64, 1);
  const Tensor targets = random_tokens(kBatch, kSeq, 64, 2);
  backward(GPT::loss(model(tokens), targets));  // warm-up: gradients allocated
  const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
  reset_peak_memory_stats(Device::cpu());
  backward(GPT::loss(model(tokens), targets));
  return memory_stats(Device::cpu()).peak_allocated_bytes - before;
}

// One block's activations: what a single block's forward keeps for its backward.
int64_t one_block_activation_bytes() {
  GPT model(memory_gpt());
  Module& block = model.submodule("transformer.h.0");
  Generator gen(4);
  const Tensor x = randn({kBatch, kSeq, 128}, gen).set_requires_grad(true);
  const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
  const Tensor y = block(x);
  return memory_stats(Device::cpu()).allocated_bytes - before - y.nbytes();
}

TEST(CheckpointMemoryTest, FullCutsActivationsToOneOverLPlusOneBlock_SelectiveInBetween) {
  const int64_t none = step_activation_bytes(CheckpointPolicy::kNone);
  const int64_t full = step_activation_bytes(CheckpointPolicy::kFull);
  const int64_t selective = step_activation_bytes(CheckpointPolicy::kSelective);
  const int64_t block = one_block_activation_bytes();
  std::printf(
      "12-layer GPT (B %lld, T %lld, C 128) activation peak: none %.2f MiB, selective "
      "%.2f MiB, full %.2f MiB; one block %.2f MiB\n",
      static_cast<long long>(kBatch), static_cast<long long>(kSeq), none / 1048576.0,
      selective / 1048576.0, full / 1048576.0, block / 1048576.0);
  // Full: the L block inputs, one block recomputed and its gradients in flight, the head.
  // Margin: half of none / L on top of none / L + one block (measured: 8.7 MiB against 4.2 +
  // 3.8).
  EXPECT_LE(full, none / kLayers + block + none / kLayers / 2);
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
}

}  // namespace
}  // namespace tessel::nn
