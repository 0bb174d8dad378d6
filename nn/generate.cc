// Sampling and the generation loop of generate.h.
#include "tessel/nn/generate.h"

#include <algorithm>
#include <functional>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

int64_t sample_token(const Tensor& logits, const SamplingOptions& options, std::mt19937_64& rng) {
  TESSEL_CHECK(logits.dim() == 1 && logits.numel() > 0, InvalidArgument,
               "sample_token: logits of shape {}: expected one non-empty dimension",
               shape_str(logits.shape()));
  TESSEL_CHECK(options.temperature >= 0, InvalidArgument,
               "sample_token: temperature {}: expected 0 (greedy) or more", options.temperature);
  TESSEL_CHECK(options.top_k >= 0, InvalidArgument,
               "sample_token: top_k {}: expected 0 (every token) or more", options.top_k);
  const std::vector<float> values = to_vector<float>(logits);
  if (options.temperature == 0) {
    return std::max_element(values.begin(), values.end()) - values.begin();
  }
  std::vector<float> weights = to_vector<float>(softmax(div(logits, options.temperature), -1));
  const int64_t vocab = static_cast<int64_t>(values.size());
  if (options.top_k > 0 && options.top_k < vocab) {
    // The k-th largest logit is the cut; a token below it gets weight 0 (ties at it stay).
    std::vector<float> sorted = values;
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(),
                     std::greater<float>());
    const float cut = sorted[options.top_k - 1];
    for (int64_t i = 0; i < vocab; ++i) {
      if (values[i] < cut) weights[i] = 0;
    }
  }
  // discrete_distribution normalises the weights: the top-k share is renormalised.
  std::discrete_distribution<int64_t> pick(weights.begin(), weights.end());
  return pick(rng);
}

std::vector<int64_t> generate(Module& model, const std::vector<int64_t>& prompt, int64_t context,
                              const GenerateOptions& options) {
  TESSEL_CHECK(!prompt.empty(), InvalidArgument, "generate: the prompt is empty: expected a token");
  TESSEL_CHECK(context >= 1, InvalidArgument, "generate: context {}: expected at least 1", context);
  TESSEL_CHECK(options.max_new_tokens >= 0, InvalidArgument,
               "generate: max_new_tokens {}: expected 0 or more", options.max_new_tokens);
  const std::vector<Tensor> params = model.parameters();
  const Device device = params.empty() ? Device::cpu() : params.front().device();
  const bool was_training = model.is_training();
  NoGradGuard no_grad;
  model.eval();
  std::mt19937_64 rng(options.seed);
  const SamplingOptions sampling{.temperature = options.temperature, .top_k = options.top_k};
  std::vector<int64_t> tokens = prompt;
  std::vector<int64_t> out;
  out.reserve(options.max_new_tokens);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    // The last `context` tokens: the positions the model has embeddings for.
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - context);
    const std::vector<int64_t> window(tokens.begin() + start, tokens.end());
    const int64_t T = static_cast<int64_t>(window.size());
    // The first output is the logits (an MoE model's second is its aux loss).
    const Tensor logits = model(Tensors{to(from_vector<int64_t>(window, {1, T}), device)})[0];
    const Tensor last = select(select(logits, 0, 0), 0, T - 1);
    tokens.push_back(sample_token(last, sampling, rng));
    out.push_back(tokens.back());
  }
  model.train(was_training);
  return out;
}

}  // namespace tessel::nn
