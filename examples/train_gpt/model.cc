#include "model.h"

#include <fmt/format.h>

#include "cp.h"
#include "moe.h"
#include "tessel/base/error.h"
#include "tessel/nn/hf_format.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/llama_plan.h"
#include "tessel/tensor/ops.h"

namespace tessel::train_gpt {

std::unique_ptr<nn::Module> ModelSpec::make() const {
  if (is_llama) return std::make_unique<nn::Llama>(llama);
  return std::make_unique<nn::GPT>(gpt);
}
void ModelSpec::init_weights(nn::Module& model) const {
  if (is_llama) {
    dynamic_cast<nn::Llama&>(model).init_weights();
  } else {
    dynamic_cast<nn::GPT&>(model).init_weights();
  }
}
ParallelizePlan ModelSpec::tp_plan(bool sequence_parallel) const {
  if (is_llama) {
    return llama_tp_plan(
        {.sequence_parallel = sequence_parallel, .tie_word_embeddings = llama.tie_word_embeddings});
  }
  return gpt_tp_plan({.sequence_parallel = sequence_parallel});
}
std::string ModelSpec::describe() const {
  if (!is_llama) {
    return fmt::format("{} layers, {} heads, embd {}, context {}: {} parameters", gpt.n_layer,
                       gpt.n_head, gpt.n_embd, gpt.block_size, nn::GPT(gpt).num_parameters());
  }
  const std::string moe = llama.moe
                              ? fmt::format(" (MoE from layer {}: {} experts of hidden {}, top-{})",
                                            llama.moe->first_dense_layers, llama.moe->num_experts,
                                            llama.moe->hidden_dim, llama.moe->top_k)
                              : "";
  return fmt::format(
      "llama, {} layers, {} heads ({} K/V), dim {}, hidden {}, {} embeddings, context {}: {} "
      "parameters{}",
      llama.n_layers, llama.n_heads, llama.kv_heads(), llama.dim, llama.ffn_hidden(),
      llama.tie_word_embeddings ? "tied" : "untied", llama.max_seq_len, llama.num_parameters(),
      moe);
}
ModelSpec model_spec(const Flags& f, int64_t data_vocab) {
  ModelSpec spec;
  if (!f.init_hf.empty()) {
    const nn::HfConfig hf = nn::read_hf_config(f.init_hf);
    spec.is_llama = hf.architecture == nn::HfArchitecture::kLlama;
    spec.hf_dir = f.init_hf;
    TESSEL_CHECK(!f.model_given || f.model == (spec.is_llama ? "llama" : "gpt"), InvalidArgument,
                 "--model {} but --init-hf '{}' holds a {}: leave --model out (the folder's "
                 "config sets the model)",
                 f.model, f.init_hf, nn::hf_architecture_name(hf.architecture));
    spec.llama = hf.llama;
    spec.gpt = hf.gpt;
    TESSEL_CHECK(data_vocab <= spec.vocab_size(), InvalidArgument,
                 "--init-hf '{}': the model's vocabulary has {} tokens but the data's has {}: "
                 "train it on token shards of its own tokenizer",
                 f.init_hf, spec.vocab_size(), data_vocab);
    TESSEL_CHECK(f.seq <= spec.context(), InvalidArgument,
                 "--seq {} is longer than the {} positions of --init-hf '{}'", f.seq,
                 spec.context(), f.init_hf);
    return spec;
  }
  spec.is_llama = f.model != "gpt";
  spec.gpt = {.vocab_size = data_vocab,
              .block_size = f.seq,
              .n_layer = f.layers,
              .n_head = f.heads,
              .n_embd = f.embd,
              .seed = f.seed};
  // A tiny Llama: Meta's MLP size rule rounded to 32, plain RoPE at theta 10000, untied unless
  // --tie-embeddings.
  spec.llama.vocab_size = data_vocab;
  spec.llama.dim = f.embd;
  spec.llama.n_layers = f.layers;
  spec.llama.n_heads = f.heads;
  spec.llama.n_kv_heads = f.kv_heads;
  spec.llama.multiple_of = 32;
  spec.llama.rope_theta = 10000.0;
  spec.llama.max_seq_len = f.seq;
  spec.llama.seed = f.seed;
  spec.llama.tie_word_embeddings = f.tie_embeddings;
  if (f.model == "llama-moe") spec.llama.moe = moe_config(f);
  return spec;
}

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  return nn::GPT::loss(logits, targets);
}
std::unique_ptr<nn::Module> build_model(const Flags& f, const ModelSpec& spec, const Layout& l,
                                        std::unique_ptr<DDPModule>* ddp, Device device,
                                        std::shared_ptr<ExpertParallel>* ep) {
  if (!l.world || f.ddp) {
    std::unique_ptr<nn::Module> model = spec.make();
    if (!spec.hf_dir.empty()) nn::load_hf_weights(*model, spec.hf_dir);
    model->to(device);  // initialised on the CPU: the same values on every device
    if (l.world) {
      // Over every rank: the (dp_replicate, dp_shard) mesh flattened.
      const DeviceMesh dp = l.mesh->flatten({"dp_replicate", "dp_shard"}, "dp");
      *ddp = std::make_unique<DDPModule>(replicate(*model, dp));
    }
    return model;
  }
  std::unique_ptr<nn::Module> model;
  {
    DefaultDeviceGuard meta(Device::meta());
    model = spec.make();
  }
  // Tensor parallelism first (each layer split over tp), then FSDP over the data-parallel ranks.
  apply_cp(*model, f, l);  // --cp: the attention over the cp ranks (before TP replaces layers)
  if (l.tp > 1) parallelize_module(*model, (*l.mesh)["tp"], spec.tp_plan(f.sequence_parallel));
  if (ep != nullptr) *ep = parallelize_moe(*model, f, l);  // --ep: the experts over ep, efsdp
  if (l.replicate * l.shard * l.cp > 1) {
    const DeviceMesh mesh = fsdp_mesh(l);  // with --cp, over dp_shard x cp
    auto& blocks = model->submodule(spec.blocks());
    for (int64_t i = 0; i < spec.layers(); ++i) {
      fully_shard(blocks.child(std::to_string(i)), mesh);
    }
    fully_shard(*model, mesh);
  }
  model->to_empty(device);
  if (!spec.hf_dir.empty()) {
    nn::load_hf_weights(*model, spec.hf_dir);  // each shard reads its box of every tensor
  } else {
    spec.init_weights(*model);  // each shard gets its part of the whole model's initial values
  }
  return model;
}

}  // namespace tessel::train_gpt
