#pragma once
// Text generation from a language model: picking the next token from logits (greedy, or
// sampled with a temperature and an optional top-k cut) and the autoregressive loop around it.
//
//   nn::GenerateOptions options{.max_new_tokens = 100, .temperature = 0.8, .top_k = 40};
//   std::vector<int64_t> out = nn::generate(model, prompt, model.config().block_size, options);

#include <cstdint>
#include <random>
#include <vector>

#include "tessel/nn/module.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

struct SamplingOptions {
  double temperature = 0.8;  // softmax(logits / temperature); 0: greedy (the argmax)
  int64_t top_k = 0;         // sample among the k largest logits only (ties kept); 0: all
};

// One token id drawn from `logits` (1-D, one entry per token, any device and floating dtype):
// the first largest logit when temperature is 0, else a draw from softmax(logits / temperature)
// restricted to the top_k largest logits (renormalised), using `rng` (so a seeded generator
// repeats its draws). Throws InvalidArgument for logits that are not 1-D and non-empty, a
// negative temperature or a negative top_k.
int64_t sample_token(const Tensor& logits, const SamplingOptions& options, std::mt19937_64& rng);

struct GenerateOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // as SamplingOptions
  int64_t top_k = 0;
  uint64_t seed = 1;  // the sampling generator's seed: the same seed gives the same text
};

// Continues `prompt` (token ids, at least one) by max_new_tokens tokens and returns the new ones.
// Each step runs `model` ((1, T) i64 tokens -> (1, T, V) logits first, on the device of its
// parameters) on the last `context` tokens at most and samples from the last position's
// logits with sample_token. Runs without gradients and in eval mode, restoring the model's
// training mode afterwards. Blocking; not thread-safe for one model. Throws InvalidArgument for
// an empty prompt, a context below 1 or a negative max_new_tokens, and whatever the model throws.
std::vector<int64_t> generate(Module& model, const std::vector<int64_t>& prompt, int64_t context,
                              const GenerateOptions& options);

}  // namespace tessel::nn
