#pragma once
// A Llama (nn/llama.h) split into pipeline stages by a layout (stage_layout.h), as gpt_stage.h
// splits the GPT: stage 0 holds the token embedding and its decoder layers, the last stage its
// layers, the final RMSNorm and the LM head; every stage makes its rotary tables from the
// sequence length. Names are the whole model's ("model.layers.3.self_attn.q_proj.weight").
//
//   auto stages = pp::make_llama_stages(cfg, pp::uniform_layout(cfg.n_layers, 4), rank, 4);
//
// With tie_word_embeddings the last stage holds its own copy of "model.embed_tokens.weight";
// pass llama_tied_parameters(cfg) as PipelineOptions::tied_parameters. Mixture-of-experts
// configs are not supported yet (their auxiliary loss would have to travel with the
// activations). Thread-safety and ownership: as nn::Module.

#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/llama.h"
#include "tessel/nn/module.h"
#include "tessel/tensor/device.h"

namespace tessel::pp {

class LlamaStage : public nn::Module {
 public:
  // A stage of `model` (whose modules it shares) holding layers [first_layer, first_layer +
  // num_layers); with_embedding / with_head: the first / last stage.
  LlamaStage(std::shared_ptr<nn::Llama> model, int stage, int first_layer, int num_layers,
             bool with_embedding, bool with_head);
  // First stage: tokens (B, T) -> hidden (B, T, dim); middle: hidden -> hidden; last: -> logits.
  Tensor forward(const Tensor& input) override;

  int stage() const { return stage_; }

 private:
  std::shared_ptr<nn::Llama> model_;  // keeps the generator the layers point to
  int stage_;
  int first_layer_;
  int num_layers_;
  bool with_embedding_;
  bool with_head_;
};

// The stages rank `rank` of `num_ranks` runs (stage s on rank s % num_ranks), in stage order,
// built on the meta device with only this rank's layers given memory on `device` and
// initialised to the whole model's values. Throws InvalidArgument for a bad layout or rank, or
// an MoE config.
std::vector<std::shared_ptr<LlamaStage>> make_llama_stages(const nn::LlamaConfig& config,
                                                           const std::vector<int>& layout, int rank,
                                                           int num_ranks,
                                                           Device device = Device::cpu());

// {"model.embed_tokens.weight"} when the config ties the LM head to it, else none.
std::vector<std::string> llama_tied_parameters(const nn::LlamaConfig& config);

}  // namespace tessel::pp
