#pragma once
// Llama: a Llama-class decoder (Llama 2/3 and relatives: RMSNorm, rotary positions with Llama 3
// scaling, SwiGLU, grouped-query attention, tied or untied embeddings) beside the GPT. Parameter
// names are Hugging Face's LlamaForCausalLM ("model.embed_tokens.weight",
// "model.layers.0.self_attn.q_proj.weight", ..., "model.norm.weight", "lm_head.weight").
//
//   Llama model(LlamaConfig::tiny());
//   Tensor logits = model(tokens);                        // (B, T) i64 -> (B, T, V)
//   Tensor loss = Llama::loss(logits, targets);           // mean cross-entropy
//   Tensors out = model({tokens, positions});             // explicit positions (T) or (B, T)
//
//   DefaultDeviceGuard meta(Device::meta());              // plan a big one without memory
//   Llama big(LlamaConfig::llama3_1_8b());                // big.num_parameters() == 8.03e9

#include <cstdint>
#include <optional>
#include <vector>

#include "tessel/kernels/llama/rope.h"
#include "tessel/nn/llama_layers.h"
#include "tessel/nn/module.h"
#include "tessel/nn/moe.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {

// The mixture-of-experts part of a Llama-class config (DeepSeek's names in brackets): which
// layers have an MoE feed-forward, and its router (see MoEOptions).
struct LlamaMoEConfig {
  int64_t num_experts = 8;  // [n_routed_experts]
  int64_t top_k = 2;        // [num_experts_per_tok]
  int64_t hidden_dim = 0;   // each expert's [moe_intermediate_size]; 0: the config's ffn_hidden()
  int64_t shared_experts = 0;      // [n_shared_experts]
  int64_t first_dense_layers = 0;  // the first layers keep a dense MLP [first_k_dense_replace]
  int64_t layer_interval = 1;      // then every this many layers is MoE [moe_layer_freq]
  MoEScore score = MoEScore::kSoftmax;
  bool norm_topk = true;  // [norm_topk_prob]
  double route_scale = 1.0;
  double bias_update_speed = 0.0;
  double aux_loss_coeff = 0.0;
  double capacity_factor = 0.0;  // 0: dropless

  bool is_moe_layer(int64_t layer) const {
    return layer >= first_dense_layers && (layer - first_dense_layers) % layer_interval == 0;
  }
};

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t dim = 64;  // hidden size
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0: n_heads (plain multi-head attention)
  int64_t head_dim = 0;    // 0: dim / n_heads
  // The MLP's hidden size; 0: Meta's rule, multiple_of * ceil(m * floor(2 * 4 dim / 3) /
  // multiple_of) with m = ffn_dim_multiplier (1 when 0).
  int64_t ffn_hidden_size = 0;
  int64_t multiple_of = 256;
  double ffn_dim_multiplier = 0.0;
  double norm_eps = 1e-5;
  double rope_theta = 500000.0;
  std::optional<kernels::RopeScaling> rope_scaling;  // Llama 3's; none: plain RoPE
  bool tie_word_embeddings = false;  // lm_head is the token embedding (no lm_head.weight)
  int64_t max_seq_len = 2048;        // longest sequence forward accepts
  double initializer_range = 0.02;   // N(0, this) for every Linear and the embedding
  uint64_t seed = 0;                 // initialisation
  // A mixture of experts in the layers it names; none: every layer dense.
  std::optional<LlamaMoEConfig> moe;

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / n_heads; }
  int64_t ffn_hidden() const;
  // Parameters of the model this config builds, counted from the shapes (no model needed).
  int64_t num_parameters() const;

  // A small model for tests: vocab 256, dim 64, 2 layers, 4 heads, 2 K/V heads, hidden 128,
  // Llama 3 rope scaling with a short original context so every band of it is used.
  static LlamaConfig tiny();
  // tiny() made DeepSeek-like for tests: layer 0 dense, layer 1 MoE with 8 sigmoid-scored
  // experts of hidden 32, top-2 normalised, one shared expert, bias balancing (step 1e-3) and
  // the aux loss (coefficient 1e-2).
  static LlamaConfig tiny_moe();
  // The published shapes (Hugging Face config.json): meta-llama/Llama-3.2-1B (1.24B, tied),
  // Llama-3.1-8B (8.03B) and Llama-3.1-70B (70.6B), vocab 128256, theta 500000, llama3
  // scaling, max_seq_len 131072.
  static LlamaConfig llama3_2_1b();
  static LlamaConfig llama3_1_8b();
  static LlamaConfig llama3_1_70b();
};

// Bytes a training step keeps per parameter set, for planning: parameters, gradients and the
// two AdamW moments, each `bytes_per_element` wide (activations not included).
struct LlamaMemoryEstimate {
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t total_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
};
LlamaMemoryEstimate estimate_llama_memory(const LlamaConfig& config, int64_t param_bytes = 2,
                                          int64_t optimizer_state_bytes = 4);

// Initialisation as Hugging Face's: N(0, initializer_range) for Linear weights and the
// embedding, RMSNorm weights 1. Thread-safety and ownership: as Module.
//
// Built under DefaultDeviceGuard(Device::meta()) the model allocates nothing; give it memory
// with to_empty(device) (or a sharding wrapper) and then call init_weights().
class Llama : public Module {
 public:
  // Throws InvalidArgument for non-positive sizes, n_heads not a multiple of the K/V heads, or
  // a bad head_dim / rope scaling.
  explicit Llama(const LlamaConfig& config);
  // (Re)initialises every parameter from a generator seeded with config().seed, in place (a
  // shard receives its box of the whole parameter's values, as GPT::init_weights), and zeroes
  // the MoE layers' balancing bias.
  void init_weights();
  // tokens (B, T) integer, 0 < T <= max_seq_len, at positions 0..T-1 -> logits (B, T, V).
  Tensor forward(const Tensor& tokens) override;
  // {tokens (B, T)} or {tokens, positions ((T) or (B, T) integer)} -> {logits (B, T, V)}, and
  // with config().moe {logits, aux_loss ()}: the sum of the MoE layers' auxiliary losses, for
  // the training loop to add to its loss (a zero scalar when aux_loss_coeff is 0).
  // Throws InvalidArgument naming the shapes otherwise, OutOfRange for a token outside the
  // vocabulary.
  Tensors forward_multi(const Tensors& inputs) override;
  // Mean cross-entropy of logits (B, T, V) against targets (B, T).
  static Tensor loss(const Tensor& logits, const Tensor& targets);

  const LlamaConfig& config() const { return config_; }
  int64_t num_parameters() const;
  // The MoE layers, in layer order (empty without config().moe): their load statistics
  // (MoE::expert_counts) and update_expert_bias() after each step.
  std::vector<MoE*> moe_layers();

 private:
  LlamaConfig config_;
  Generator gen_;  // declared before the layers that keep a pointer to it
};

}  // namespace tessel::nn
