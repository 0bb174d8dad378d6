#pragma once
// What the pipeline runtime's parity tests share: a tiny GPT, the batches it learns from and
// the losses one process gets on them (the losses every pipeline layout must match).

#include <cstdint>
#include <utility>
#include <vector>

#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::pp::testing {

inline constexpr int64_t kBatch = 8;  // rows of the global batch
inline constexpr int64_t kSeq = 8;
inline constexpr double kMaxNorm = 1.0;  // gradient clipping

inline nn::GptConfig tiny_gpt(int64_t layers) {
  return {.vocab_size = 64,
          .block_size = kSeq,
          .n_layer = layers,
          .n_head = 2,
          .n_embd = 16,
          .seed = 7};
}

inline nn::optim::AdamWOptions adamw_options() { return {.lr = 1e-2, .weight_decay = 0.1}; }

// Step i's batch: rows of a repeating pattern the model can learn, so the loss moves.
inline std::pair<Tensor, Tensor> batch(int step) {
  std::vector<int64_t> tokens, targets;
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t t = 0; t <= kSeq; ++t) {
      const int64_t v = (step * 5 + b * 3 + t * (b % 3 + 1)) % 64;
      if (t < kSeq) tokens.push_back(v);
      if (t > 0) targets.push_back(v);
    }
  }
  return {from_vector<int64_t>(tokens, {kBatch, kSeq}),
          from_vector<int64_t>(targets, {kBatch, kSeq})};
}

// One process, the whole model of `config`, the whole batch, AdamW with clipping: the loss of
// each of `steps` steps.
inline std::vector<double> one_process_losses(const nn::GptConfig& config, int steps) {
  nn::GPT model(config);
  nn::optim::AdamW opt(model.parameters(), adamw_options());
  std::vector<double> out;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step);
    model.zero_grad();
    Tensor loss = nn::GPT::loss(model(x), y);
    tessel::backward(loss);
    nn::optim::clip_grad_norm(model.parameters(), kMaxNorm);
    opt.step();
    out.push_back(item(loss));
  }
  return out;
}

}  // namespace tessel::pp::testing
