#include "tessel/parallel/tp/llama_plan.h"

#include <optional>

namespace tessel {

ParallelizePlan llama_tp_plan(const LlamaTpOptions& options) {
  // Without sequence parallelism the residual stream is whole on every rank (each layer
  // all_reduces twice, after o_proj and down_proj); with it, the stream is split by sequence
  // (Shard(1) of (B, T, C)): all_gather before each column-parallel projection, reduce_scatter
  // after each row-parallel one. q, k and v gather their input separately: each one's
  // reduce_scatter in backward then carries its own partial gradient of the shared input.
  const bool sp = options.sequence_parallel;
  const Placement stream = sp ? Placement(Shard{1}) : Placement(Replicate{});
  const int64_t overlap = sp ? options.overlap_chunks : 0;
  const ColwiseParallel colwise{.input_layout = stream, .overlap_chunks = overlap};
  const RowwiseParallel rowwise{.output_layout = stream};
  ParallelizePlan plan = {
      {"model.embed_tokens", RowwiseParallel{.input_layout = Replicate{}, .output_layout = stream}},
      {"model.layers.*.self_attn.q_proj", colwise},
      {"model.layers.*.self_attn.k_proj", colwise},
      {"model.layers.*.self_attn.v_proj", colwise},
      {"model.layers.*.self_attn.o_proj", rowwise},
      {"model.layers.*.mlp.gate_proj", colwise},
      {"model.layers.*.mlp.up_proj", colwise},
      {"model.layers.*.mlp.down_proj", rowwise},
  };
  if (sp) {
    plan.emplace_back("model.layers.*.input_layernorm", SequenceParallel{});
    plan.emplace_back("model.layers.*.post_attention_layernorm", SequenceParallel{});
    plan.emplace_back("model.norm", SequenceParallel{});
  }
  if (options.tie_word_embeddings) {
    // The tied LM head multiplies by this rank's vocabulary rows of the embedding: its input's
    // gradient is a partial sum over the group.
    plan.emplace_back("model.norm", PrepareModuleOutput{.output_layouts = {stream},
                                                        .desired_output_layouts = {Replicate{}},
                                                        .partial_gradients = true});
  } else {
    // The untied LM head is split by vocabulary rows: logits Shard(-1) for loss parallelism.
    plan.emplace_back("lm_head",
                      ColwiseParallel{.input_layout = stream, .overlap_chunks = overlap});
  }
  return plan;
}

}  // namespace tessel
