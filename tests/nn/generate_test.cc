// nn::sample_token and nn::generate: greedy is the argmax, top-k restricts the support, a seed
// repeats the draws, and the loop feeds the model at most its context.
#include "tessel/nn/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/gpt.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

Tensor logits_of(const std::vector<float>& values) {
  return from_vector<float>(values, {static_cast<int64_t>(values.size())});
}

TEST(SampleTokenTest, TemperatureZeroIsTheArgmax) {
  std::mt19937_64 rng(7);
  const SamplingOptions greedy{.temperature = 0};
  EXPECT_EQ(sample_token(logits_of({0.1f, 2.5f, -1.0f, 2.4f}), greedy, rng), 1);
  EXPECT_EQ(sample_token(logits_of({-3.0f}), greedy, rng), 0);
  // Ties: the first largest, as argmax.
  EXPECT_EQ(sample_token(logits_of({1.0f, 4.0f, 4.0f, 0.0f}), greedy, rng), 1);
  // top_k does not change the greedy choice.
  EXPECT_EQ(sample_token(logits_of({0.1f, 2.5f, -1.0f}), {.temperature = 0, .top_k = 1}, rng), 1);
}

TEST(SampleTokenTest, TopKRestrictsTheSupport) {
  // Nearly flat logits: without a cut every token would be drawn.
  const std::vector<float> values = {0.5f, 0.1f, 0.9f, 0.3f, 0.8f, 0.0f, 0.2f, 0.7f};
  std::mt19937_64 rng(3);
  std::set<int64_t> drawn, drawn_all;
  for (int i = 0; i < 2000; ++i) {
    drawn.insert(sample_token(logits_of(values), {.temperature = 1.0, .top_k = 3}, rng));
    drawn_all.insert(sample_token(logits_of(values), {.temperature = 1.0}, rng));
  }
  EXPECT_EQ(drawn, (std::set<int64_t>{2, 4, 7}));  // the three largest: 0.9, 0.8, 0.7
  EXPECT_EQ(drawn_all.size(), values.size());
  // top_k = 1 is greedy; top_k at or above the vocabulary is no cut.
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_token(logits_of(values), {.temperature = 2.0, .top_k = 1}, rng), 2);
  }
  std::set<int64_t> drawn_big_k;
  for (int i = 0; i < 2000; ++i) {
    drawn_big_k.insert(sample_token(logits_of(values), {.temperature = 1.0, .top_k = 100}, rng));
  }
  EXPECT_EQ(drawn_big_k.size(), values.size());
}

TEST(SampleTokenTest, DrawsFollowTheSoftmaxOfLogitsOverTemperature) {
  // p(1) = 3/4 at temperature 1; at temperature 2 the logits halve: p(1) = sqrt(3)/(1+sqrt(3)).
  const Tensor logits = logits_of({0.0f, static_cast<float>(std::log(3.0))});
  for (const auto& [temperature, expected] :
       {std::pair{1.0, 0.75}, std::pair{2.0, std::sqrt(3.0) / (1 + std::sqrt(3.0))}}) {
    std::mt19937_64 rng(11);
    int ones = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) ones += sample_token(logits, {.temperature = temperature}, rng);
    EXPECT_NEAR(static_cast<double>(ones) / n, expected, 0.02) << "temperature " << temperature;
  }
}

TEST(SampleTokenTest, SeededDrawsRepeat) {
  const Tensor logits = logits_of({0.3f, 0.1f, 0.4f, 0.1f, 0.5f});
  auto draws = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample_token(logits, {.top_k = 4}, rng));
    return out;
  };
  EXPECT_EQ(draws(5), draws(5));
  EXPECT_NE(draws(5), draws(6));
}

TEST(SampleTokenTest, RefusesBadArguments) {
  std::mt19937_64 rng(1);
  EXPECT_THROW(sample_token(logits_of({1.0f}), {.temperature = -0.5}, rng), InvalidArgument);
  EXPECT_THROW(sample_token(logits_of({1.0f}), {.top_k = -1}, rng), InvalidArgument);
  EXPECT_THROW(sample_token(from_vector<float>({1, 2, 3, 4}, {2, 2}), {}, rng), InvalidArgument);
}

GPT tiny_gpt() {
  return GPT(
      {.vocab_size = 16, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16, .seed = 4});
}

TEST(GenerateTest, GreedyFollowsTheModelsArgmax) {
  GPT model = tiny_gpt();
  const std::vector<int64_t> prompt = {3, 1, 4};
  const std::vector<int64_t> out =
      generate(model, prompt, 8, {.max_new_tokens = 12, .temperature = 0});
  ASSERT_EQ(out.size(), 12u);
  // Re-derive each token: the argmax of the last position over at most 8 tokens of context.
  std::vector<int64_t> tokens = prompt;
  for (const int64_t token : out) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - 8);
    const std::vector<int64_t> window(tokens.begin() + start, tokens.end());
    const int64_t T = static_cast<int64_t>(window.size());
    const Tensor logits = model(from_vector<int64_t>(window, {1, T}));
    EXPECT_EQ(token, item_int(argmax(select(select(logits, 0, 0), 0, T - 1), 0)));
    tokens.push_back(token);
  }
  EXPECT_TRUE(model.is_training());  // the mode it came in with
}

TEST(GenerateTest, SeededGenerationRepeats) {
  GPT model = tiny_gpt();
  const GenerateOptions options{.max_new_tokens = 20, .temperature = 1.5, .top_k = 2, .seed = 9};
  const std::vector<int64_t> a = generate(model, {1}, 8, options);
  EXPECT_EQ(a, generate(model, {1}, 8, options));
  GenerateOptions other = options;
  other.seed = 10;
  EXPECT_NE(a, generate(model, {1}, 8, other));
  EXPECT_TRUE(generate(model, {1}, 8, {.max_new_tokens = 0}).empty());
}

TEST(GenerateTest, RefusesAnEmptyPromptOrContext) {
  GPT model = tiny_gpt();
  EXPECT_THROW(generate(model, {}, 8, {}), InvalidArgument);
  EXPECT_THROW(generate(model, {1}, 0, {}), InvalidArgument);
  EXPECT_THROW(generate(model, {1}, 8, {.max_new_tokens = -1}), InvalidArgument);
}

}  // namespace
}  // namespace tessel::nn
