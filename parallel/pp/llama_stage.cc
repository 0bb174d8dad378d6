// Llama pipeline stages: the layers of one stage under the whole model's names.
#include "tessel/parallel/pp/llama_stage.h"

#include <string>

#include "tessel/base/error.h"
#include "tessel/parallel/pp/internal/stage_build.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/ops.h"

namespace tessel::pp {
using internal::shared_child;

LlamaStage::LlamaStage(std::shared_ptr<nn::Llama> model, int stage, int first_layer, int num_layers,
                       bool with_embedding, bool with_head)
    : Module("LlamaStage"),
      model_(std::move(model)),
      stage_(stage),
      first_layer_(first_layer),
      num_layers_(num_layers),
      with_embedding_(with_embedding),
      with_head_(with_head) {
  TESSEL_CHECK(model_ != nullptr && first_layer >= 0 && num_layers >= 0 &&
                   first_layer + num_layers <= model_->config().n_layers,
               InvalidArgument, "LlamaStage {}: layers [{}, {}) outside the model's {} layers",
               stage, first_layer, first_layer + num_layers,
               model_ ? model_->config().n_layers : int64_t{0});
  const bool tied = model_->config().tie_word_embeddings;
  const nn::Module& whole = model_->child("model");
  auto inner = register_module("model", std::make_shared<Module>("ModuleDict"));
  if (with_embedding || (with_head && tied)) {
    inner->register_module("embed_tokens", shared_child(whole, "embed_tokens"));
  }
  auto layers = inner->register_module("layers", std::make_shared<Module>("ModuleDict"));
  for (int l = first_layer; l < first_layer + num_layers; ++l) {
    const std::string name = std::to_string(l);
    layers->register_module(name, shared_child(whole.child("layers"), name));
  }
  inner->register_module("rotary_emb", shared_child(whole, "rotary_emb"));
  if (with_head) {
    inner->register_module("norm", shared_child(whole, "norm"));
    if (!tied) register_module("lm_head", shared_child(*model_, "lm_head"));
  }
}

Tensor LlamaStage::forward(const Tensor& input) {
  Module& inner = child("model");
  Tensor x = input;
  if (with_embedding_) {
    const int64_t max_len = model_->config().max_seq_len;
    TESSEL_CHECK(input.dim() == 2 && !is_floating(input.dtype()) && input.size(1) > 0 &&
                     input.size(1) <= max_len,
                 InvalidArgument,
                 "Llama stage {} expects integer tokens (B, T) with 0 < T <= max_seq_len {}, "
                 "got {}",
                 stage_, max_len, input.str());
    x = inner.child("embed_tokens")(input);
  }
  if (num_layers_ > 0) {
    const Tensor positions = arange(x.size(1), DType::kI64, x.device());
    const nn::Tensors cos_sin = inner.child("rotary_emb")(nn::Tensors{positions});
    Module& layers = inner.child("layers");
    for (int l = first_layer_; l < first_layer_ + num_layers_; ++l) {
      x = layers.child(std::to_string(l))({x, cos_sin[0], cos_sin[1]})[0];
    }
  }
  if (with_head_) {
    x = inner.child("norm")(x);
    x = model_->config().tie_word_embeddings ? linear(x, parameter("model.embed_tokens.weight"))
                                             : child("lm_head")(x);
  }
  return x;
}

std::vector<std::shared_ptr<LlamaStage>> make_llama_stages(const nn::LlamaConfig& config,
                                                           const std::vector<int>& layout, int rank,
                                                           int num_ranks, Device device) {
  TESSEL_CHECK(!config.moe, InvalidArgument,
               "Llama stages: mixture-of-experts configs are not supported by pipeline stages "
               "yet (the auxiliary loss would travel with the activations)");
  return internal::build_stages<LlamaStage, nn::Llama>(config, static_cast<int>(config.n_layers),
                                                       layout, rank, num_ranks, device, "Llama");
}

std::vector<std::string> llama_tied_parameters(const nn::LlamaConfig& config) {
  if (!config.tie_word_embeddings) return {};
  return {"model.embed_tokens.weight"};
}

}  // namespace tessel::pp
