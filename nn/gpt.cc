#include "tessel/nn/gpt.h"

#include <cmath>
#include <string_view>

#include "tessel/base/error.h"
#include "tessel/nn/linear.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

GPT::GPT(const GptConfig& config) : Module("GPT"), config_(config), gen_(config.seed) {
  TESSEL_CHECK(config.vocab_size > 0 && config.block_size > 0 && config.n_layer > 0,
               InvalidArgument, "GPT needs positive vocab_size {}, block_size {}, n_layer {}",
               config.vocab_size, config.block_size, config.n_layer);
  const AttentionOptions attention{config.n_embd, config.n_head, config.dropout, config.bias};
  auto transformer = register_module("transformer", std::make_shared<Module>("ModuleDict"));
  transformer->register_module(
      "wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, &gen_));
  transformer->register_module(
      "wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, &gen_));
  transformer->register_module("drop", std::make_shared<Dropout>(config.dropout, &gen_));
  auto h = transformer->register_module("h", std::make_shared<ModuleList>());
  for (int64_t l = 0; l < config.n_layer; ++l) {
    h->push_back(std::make_shared<Block>(attention, &gen_));
  }
  transformer->register_module("ln_f",
                               std::make_shared<LayerNorm>(config.n_embd, 1e-5, config.bias));
  init_weights();
}

void GPT::init_weights() {
  // GPT-2 initialisation, in place so every slot keeps its tensor.
  gen_.manual_seed(config_.seed);
  NoGradGuard no_grad;
  const GptConfig& config = config_;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (auto& [name, p] : named_parameters()) {
    if (name.find(".ln_") != std::string::npos) {  // norms: weight 1, bias 0
      fill_(p, ends_with(name, ".bias") ? 0.0 : 1.0);
    } else if (ends_with(name, ".bias")) {
      zero_(p);
    } else {
      // In place: a shard (FSDP, TP) draws its box of the whole tensor's values.
      normal_(p, 0.0, ends_with(name, "c_proj.weight") ? residual_std : 0.02, &gen_);
    }
  }
}

Tensor GPT::forward(const Tensor& tokens) {
  TESSEL_CHECK(tokens.dim() == 2 && !is_floating(tokens.dtype()) &&
                   tokens.size(1) <= config_.block_size && tokens.size(1) > 0,
               InvalidArgument,
               "GPT expects integer tokens (B, T) with 0 < T <= block_size {}, got {}",
               config_.block_size, tokens.str());
  const int64_t T = tokens.size(1);
  Module& transformer = child("transformer");
  Tensor x = add(transformer.child("wte")(tokens),
                 transformer.child("wpe")(arange(T, DType::kI64, tokens.device())));
  x = transformer.child("drop")(x);
  const auto& blocks = transformer.child_as<ModuleList>("h");
  for (size_t l = 0; l < blocks.size(); ++l) x = blocks[l](x);
  // The LM head is the token embedding's weight (tied).
  return linear(transformer.child("ln_f")(x), parameter("transformer.wte.weight"));
}

Tensor GPT::loss(const Tensor& logits, const Tensor& targets) {
  TESSEL_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                   logits.size(1) == targets.size(1),
               InvalidArgument,
               "GPT::loss expects logits (B, T, V) and targets (B, T), got {} and {}",
               shape_str(logits.shape()), shape_str(targets.shape()));
  const int64_t rows = logits.size(0) * logits.size(1);
  return cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}));
}

int64_t GPT::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

}  // namespace tessel::nn
