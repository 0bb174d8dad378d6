#include "tessel/nn/llama.h"

#include <memory>
#include <string_view>

#include "tessel/base/error.h"
#include "tessel/nn/embedding.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/norm.h"
#include "tessel/nn/rope.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

LlamaConfig llama3_shape(int64_t dim, int64_t layers, int64_t heads, int64_t ffn, double factor,
                         bool tied) {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = 8;
  c.ffn_hidden_size = ffn;
  c.norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = kernels::RopeScaling{.factor = factor,
                                        .low_freq_factor = 1.0,
                                        .high_freq_factor = 4.0,
                                        .original_max_position_embeddings = 8192};
  c.tie_word_embeddings = tied;
  c.max_seq_len = 131072;
  return c;
}

}  // namespace

int64_t LlamaConfig::ffn_hidden() const {
  if (ffn_hidden_size > 0) return ffn_hidden_size;
  // Meta's reference: 2/3 of 4 dim, times the multiplier, rounded up to multiple_of.
  int64_t hidden = 2 * (4 * dim) / 3;
  if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * hidden);
  const int64_t m = multiple_of > 0 ? multiple_of : 1;
  return m * ((hidden + m - 1) / m);
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t C = dim, D = head_size(), H = n_heads, Hkv = kv_heads(), F = ffn_hidden();
  const int64_t attention = C * H * D + 2 * C * Hkv * D + H * D * C;
  int64_t layers = 0;
  for (int64_t l = 0; l < n_layers; ++l) {
    layers += attention + 2 * C;
    if (moe && moe->is_moe_layer(l)) {
      const int64_t Fe = moe->hidden_dim > 0 ? moe->hidden_dim : F;
      layers += C * moe->num_experts + (moe->num_experts + moe->shared_experts) * 3 * C * Fe;
    } else {
      layers += 3 * C * F;
    }
  }
  return vocab_size * C + layers + C + (tie_word_embeddings ? 0 : vocab_size * C);
}

LlamaConfig LlamaConfig::tiny() {
  LlamaConfig c;
  c.vocab_size = 256;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden_size = 128;
  c.rope_theta = 10000.0;
  // Wavelengths of a head of 16 run from 2 pi to ~ 2 pi * 3162: with an original context of
  // 64, some are stretched (> 64), some kept (< 16) and some interpolated.
  c.rope_scaling = kernels::RopeScaling{.factor = 4.0,
                                        .low_freq_factor = 1.0,
                                        .high_freq_factor = 4.0,
                                        .original_max_position_embeddings = 64};
  c.max_seq_len = 256;
  return c;
}

LlamaConfig LlamaConfig::tiny_moe() {
  LlamaConfig c = tiny();
  c.moe = LlamaMoEConfig{.num_experts = 8,
                         .top_k = 2,
                         .hidden_dim = 32,
                         .shared_experts = 1,
                         .first_dense_layers = 1,
                         .layer_interval = 1,
                         .score = MoEScore::kSigmoid,
                         .norm_topk = true,
                         .route_scale = 1.0,
                         .bias_update_speed = 1e-3,
                         .aux_loss_coeff = 1e-2};
  return c;
}

LlamaConfig LlamaConfig::llama3_2_1b() { return llama3_shape(2048, 16, 32, 8192, 32.0, true); }
LlamaConfig LlamaConfig::llama3_1_8b() { return llama3_shape(4096, 32, 32, 14336, 8.0, false); }
LlamaConfig LlamaConfig::llama3_1_70b() { return llama3_shape(8192, 80, 64, 28672, 8.0, false); }

LlamaMemoryEstimate estimate_llama_memory(const LlamaConfig& config, int64_t param_bytes,
                                          int64_t optimizer_state_bytes) {
  LlamaMemoryEstimate e;
  e.parameters = config.num_parameters();
  e.parameter_bytes = e.parameters * param_bytes;
  e.gradient_bytes = e.parameters * param_bytes;
  e.optimizer_bytes = 2 * e.parameters * optimizer_state_bytes;
  return e;
}

Llama::Llama(const LlamaConfig& config) : Module("Llama"), config_(config), gen_(config.seed) {
  TESSEL_CHECK(config.vocab_size > 0 && config.dim > 0 && config.n_layers > 0 &&
                   config.n_heads > 0 && config.max_seq_len > 0 && config.ffn_hidden() > 0,
               InvalidArgument,
               "Llama needs positive vocab_size {}, dim {}, n_layers {}, n_heads {}, "
               "max_seq_len {} and ffn hidden size {}",
               config.vocab_size, config.dim, config.n_layers, config.n_heads, config.max_seq_len,
               config.ffn_hidden());
  const LlamaAttentionOptions attention{config.dim, config.n_heads, config.kv_heads(),
                                        config.head_dim};
  auto model = register_module("model", std::make_shared<Module>("LlamaModel"));
  model->register_module("embed_tokens",
                         std::make_shared<Embedding>(config.vocab_size, config.dim, &gen_));
  auto layers = model->register_module("layers", std::make_shared<ModuleList>());
  if (config.moe) {
    const LlamaMoEConfig& m = *config.moe;
    TESSEL_CHECK(m.first_dense_layers >= 0 && m.layer_interval > 0, InvalidArgument,
                 "Llama: moe.first_dense_layers ({}) must be >= 0 and moe.layer_interval ({}) > 0",
                 m.first_dense_layers, m.layer_interval);
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    std::optional<MoEOptions> moe;
    if (config.moe && config.moe->is_moe_layer(l)) {
      const LlamaMoEConfig& m = *config.moe;
      moe = MoEOptions{.dim = config.dim,
                       .hidden_dim = m.hidden_dim > 0 ? m.hidden_dim : config.ffn_hidden(),
                       .num_experts = m.num_experts,
                       .top_k = m.top_k,
                       .score = m.score,
                       .norm_topk = m.norm_topk,
                       .route_scale = m.route_scale,
                       .shared_experts = m.shared_experts,
                       .bias_update_speed = m.bias_update_speed,
                       .aux_loss_coeff = m.aux_loss_coeff,
                       .capacity_factor = m.capacity_factor};
    }
    layers->push_back(std::make_shared<LlamaDecoderLayer>(
        attention, config.ffn_hidden(), config.norm_eps, &gen_, moe ? &*moe : nullptr));
  }
  model->register_module("norm", std::make_shared<RMSNorm>(config.dim, config.norm_eps));
  model->register_module("rotary_emb",
                         std::make_shared<RotaryEmbedding>(config.head_size(), config.rope_theta,
                                                           config.rope_scaling));
  if (!config.tie_word_embeddings) {
    register_module("lm_head", std::make_shared<Linear>(
                                   LinearOptions{config.dim, config.vocab_size, false}, &gen_));
  }
  init_weights();
}

void Llama::init_weights() {
  gen_.manual_seed(config_.seed);
  NoGradGuard no_grad;
  for (auto& [name, p] : named_parameters()) {
    if (ends_with(name, "norm.weight")) {
      fill_(p, 1.0);
    } else {
      normal_(p, 0.0, config_.initializer_range, &gen_);
    }
  }
  // The MoE layers' balancing bias starts at zero (a model built on the meta device and given
  // memory by to_empty holds garbage there).
  for (auto& [name, b] : named_buffers()) {
    if (ends_with(name, "expert_bias")) fill_(b, 0.0);
  }
}

Tensor Llama::forward(const Tensor& tokens) { return forward_multi({tokens})[0]; }

Tensors Llama::forward_multi(const Tensors& inputs) {
  TESSEL_CHECK(inputs.size() == 1 || inputs.size() == 2, InvalidArgument,
               "Llama takes {{tokens}} or {{tokens, positions}}, got {} inputs", inputs.size());
  const Tensor& tokens = inputs[0];
  TESSEL_CHECK(tokens.dim() == 2 && !is_floating(tokens.dtype()) && tokens.size(1) > 0 &&
                   tokens.size(1) <= config_.max_seq_len,
               InvalidArgument,
               "Llama expects integer tokens (B, T) with 0 < T <= max_seq_len {}, got {}",
               config_.max_seq_len, tokens.str());
  const int64_t B = tokens.size(0), T = tokens.size(1);
  Tensor positions = inputs.size() == 2 ? inputs[1] : arange(T, DType::kI64, tokens.device());
  TESSEL_CHECK(positions.shape() == Shape{T} || positions.shape() == (Shape{B, T}), InvalidArgument,
               "Llama: positions must be ({}) or ({}, {}), got {}", T, B, T, positions.str());
  Module& model = child("model");
  const Tensors cos_sin = model.child("rotary_emb")(Tensors{positions});
  Tensor x = model.child("embed_tokens")(tokens);
  const auto& layers = model.child_as<ModuleList>("layers");
  Tensor aux;  // the MoE layers' auxiliary losses, summed
  for (size_t l = 0; l < layers.size(); ++l) {
    Tensors out = layers[l]({x, cos_sin[0], cos_sin[1]});
    x = out[0];
    if (out.size() == 2) aux = aux.defined() ? add(aux, out[1]) : out[1];
  }
  x = model.child("norm")(x);
  Tensor logits = config_.tie_word_embeddings ? linear(x, parameter("model.embed_tokens.weight"))
                                              : child("lm_head")(x);
  if (!config_.moe) return {logits};
  return {logits, aux.defined() ? aux : zeros(Shape{}, DType::kF32, logits.device())};
}

Tensor Llama::loss(const Tensor& logits, const Tensor& targets) {
  TESSEL_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                   logits.size(1) == targets.size(1),
               InvalidArgument,
               "Llama::loss expects logits (B, T, V) and targets (B, T), got {} and {}",
               shape_str(logits.shape()), shape_str(targets.shape()));
  const int64_t rows = logits.size(0) * logits.size(1);
  return cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}));
}

std::vector<MoE*> Llama::moe_layers() {
  std::vector<MoE*> out;
  auto& layers = child("model").child_as<ModuleList>("layers");
  for (size_t l = 0; l < layers.size(); ++l) {
    if (auto* moe = dynamic_cast<MoE*>(&layers[l].child("mlp"))) out.push_back(moe);
  }
  return out;
}

int64_t Llama::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

}  // namespace tessel::nn
