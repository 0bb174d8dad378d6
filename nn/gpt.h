#pragma once
// GPT with the GPT-2 layout: token and position embeddings, N pre-norm transformer blocks, a
// final LayerNorm, and an LM head tied to the token embedding. Parameter names match
// nanoGPT / Hugging Face ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...;
// Linear weights are (out, in), not GPT-2's transposed Conv1D).
//
//   GPT model({.vocab_size = 256, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 128});
//   Tensor logits = model(tokens);                    // (B, T) i64 -> (B, T, V)
//   Tensor loss = GPT::loss(logits, targets);         // mean cross-entropy
//   backward(loss);

#include <cstdint>
#include <memory>

#include "tessel/nn/dropout.h"
#include "tessel/nn/embedding.h"
#include "tessel/nn/module.h"
#include "tessel/nn/norm.h"
#include "tessel/nn/transformer.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {

struct GptConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // longest sequence (position embeddings)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  bool bias = true;   // biases in Linear and LayerNorm
  uint64_t seed = 0;  // initialisation and dropout masks
};

// Initialisation follows GPT-2: weights N(0, 0.02), residual output projections ("c_proj")
// N(0, 0.02 / sqrt(2 * n_layer)), biases 0, norms 1. Thread-safety and ownership: as Module.
//
// Built under DefaultDeviceGuard(Device::meta()) the model allocates nothing; give it memory
// with to_empty(device) (or a sharding wrapper) and then call init_weights().
class GPT : public Module {
 public:
  // Throws InvalidArgument for non-positive sizes or n_embd not divisible by n_head.
  explicit GPT(const GptConfig& config);
  // (Re)initialises every parameter as the constructor does, from a generator seeded with
  // config().seed (the same values as a freshly constructed model), in place. A parameter that
  // is a shard (Tensor::shard_info) receives its box of the whole parameter's values, so a
  // sharded model built on the meta device is initialised exactly like the whole one.
  void init_weights();
  // tokens (B, T) integer, T <= block_size -> logits (B, T, vocab_size). Throws InvalidArgument
  // naming the shape otherwise, OutOfRange for a token outside the vocabulary.
  Tensor forward(const Tensor& tokens) override;
  // Mean cross-entropy of logits (B, T, V) against targets (B, T).
  static Tensor loss(const Tensor& logits, const Tensor& targets);

  const GptConfig& config() const { return config_; }
  int64_t num_parameters() const;

 private:
  GptConfig config_;
  Generator gen_;  // declared before the layers that keep a pointer to it
};

}  // namespace tessel::nn
