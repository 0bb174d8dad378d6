#pragma once
// The tensor-parallel plan of nn::Llama (Hugging Face's LlamaForCausalLM names), written out as
// a table as torchtitan's: Megatron's split of every decoder layer — q_proj, k_proj, v_proj and
// gate_proj, up_proj by output features (whole heads, whole hidden units), o_proj and down_proj
// by input features — a vocabulary-split token embedding, and a vocabulary-split LM head (the
// embedding itself when tied). With sequence parallelism the RMSNorms and the residual stream
// run on sequence shards between the layers' matmuls.
//
//   parallelize_module(model, mesh["tp"], llama_tp_plan({.sequence_parallel = true}));
//   Tensor loss = loss_parallel_cross_entropy(model(x), y, mesh["tp"], config.vocab_size);
//
// The logits come out split by vocabulary: feed them to loss_parallel_cross_entropy
// (tessel/parallel/tp/loss.h). Each rank runs n_heads / tp query heads and n_kv_heads / tp K/V
// heads (grouped-query attention stays grouped: rank r's query heads use rank r's K/V heads),
// so both head counts must divide by tp — parallelize_module refuses the plan otherwise, naming
// the attention and its heads. With sequence parallelism the sequence length must be a multiple
// of tp. Compose with FSDP as for the GPT: this plan first, then fully_shard per decoder layer
// ("model.layers.*") and at the root.

#include <cstdint>

#include "tessel/parallel/tp/parallelize.h"

namespace tessel {

struct LlamaTpOptions {
  bool sequence_parallel = false;
  // The model's LlamaConfig::tie_word_embeddings: the LM head is then the (vocabulary-split)
  // embedding, and there is no lm_head module to split.
  bool tie_word_embeddings = false;
  // > 0 (sequence parallelism only): the all_gathers before the column-parallel projections are
  // split in this many chunks overlapped with the matmul (ColwiseParallel::overlap_chunks).
  int64_t overlap_chunks = 0;
};

ParallelizePlan llama_tp_plan(const LlamaTpOptions& options = {});

}  // namespace tessel
