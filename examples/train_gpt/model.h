// The model train_gpt trains (a GPT or a Llama, from the flags or a Hugging Face folder) and how
// it is built over the layout: DDP, or tensor parallelism and FSDP on a meta-device model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "flags.h"
#include "layout.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/ep/expert_parallel.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/tp/parallelize.h"

namespace tessel::train_gpt {

// The model train_gpt trains: a GPT or a Llama, shaped by the flags or, with --init-hf, by the
// folder's config.json.
struct ModelSpec {
  bool is_llama = false;
  nn::GptConfig gpt;
  nn::LlamaConfig llama;
  std::string hf_dir;  // --init-hf: the weights come from there

  int64_t vocab_size() const { return is_llama ? llama.vocab_size : gpt.vocab_size; }
  int64_t layers() const { return is_llama ? llama.n_layers : gpt.n_layer; }
  int64_t context() const { return is_llama ? llama.max_seq_len : gpt.block_size; }
  // The module whose children are the blocks (FSDP shards each).
  const char* blocks() const { return is_llama ? "model.layers" : "transformer.h"; }
  std::unique_ptr<nn::Module> make() const;
  void init_weights(nn::Module& model) const;
  ParallelizePlan tp_plan(bool sequence_parallel) const;
  // "3 layers, 4 heads, embd 96, context 64: 342912 parameters", with the Llama's K/V heads.
  std::string describe() const;
};

// The model of the flags — --model at --layers, --heads (--kv-heads), --embd, --seq over the
// data's vocabulary — or of --init-hf's config.json, which must take the data's tokens and
// --seq. Throws InvalidArgument naming the mismatch.
ModelSpec model_spec(const Flags& f, int64_t data_vocab);

// The mean next-token cross-entropy of logits (B, T, V) against targets (B, T) (nn::GPT::loss
// and nn::Llama::loss are the same).
Tensor lm_loss(const Tensor& logits, const Tensor& targets);

// FSDP (with HSDP when replicated) on each block and then the root; the model is built on the
// meta device so that only this rank's shards are ever allocated, then initialised or, with
// --init-hf, loaded (each rank reading its shards' bytes). With --ddp the whole model is
// replicated (`ddp` is then set). With --ep, the experts are sharded over ep first (`ep` is
// then set; moe.h).
std::unique_ptr<nn::Module> build_model(const Flags& f, const ModelSpec& spec, const Layout& l,
                                        std::unique_ptr<DDPModule>* ddp, Device device,
                                        std::shared_ptr<ExpertParallel>* ep = nullptr);

}  // namespace tessel::train_gpt
