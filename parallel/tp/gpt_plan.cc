#include "tessel/parallel/tp/gpt_plan.h"

namespace tessel {

ParallelizePlan gpt_tp_plan(const GptTpOptions& options) {
  if (!options.sequence_parallel) {
    // The residual stream is whole on every rank; each block all_reduces twice (after c_proj).
    return {
        {"transformer.wte", RowwiseParallel{.input_layout = Replicate{}}},
        {"transformer.h.*.attn.c_attn", ColwiseParallel{.sections = 3}},
        {"transformer.h.*.attn.c_proj", RowwiseParallel{}},
        {"transformer.h.*.mlp.c_fc", ColwiseParallel{}},
        {"transformer.h.*.mlp.c_proj", RowwiseParallel{}},
        // The tied LM head multiplies by this rank's vocabulary rows: its input's gradient is
        // a partial sum over the group.
        {"transformer.ln_f", PrepareModuleOutput{.output_layouts = {Replicate{}},
                                                 .desired_output_layouts = {Replicate{}},
                                                 .partial_gradients = true}},
    };
  }
  // Between the matmuls the residual stream is split by sequence (Shard(1) of (B, T, C)):
  // all_gather before each ColwiseParallel, reduce_scatter after each RowwiseParallel.
  const Placement seq = Shard{1};
  const int64_t overlap = options.overlap_chunks;
  return {
      {"transformer.wte", RowwiseParallel{.input_layout = Replicate{}, .output_layout = seq}},
      // wpe gives (T, C): this rank's positions are rows of dim 0.
      {"transformer.wpe",
       PrepareModuleOutput{.output_layouts = {Replicate{}}, .desired_output_layouts = {Shard{0}}}},
      {"transformer.drop", SequenceParallel{}},
      {"transformer.h.*.ln_1", SequenceParallel{}},
      {"transformer.h.*.attn.c_attn",
       ColwiseParallel{.input_layout = seq, .sections = 3, .overlap_chunks = overlap}},
      {"transformer.h.*.attn.c_proj", RowwiseParallel{.output_layout = seq}},
      {"transformer.h.*.ln_2", SequenceParallel{}},
      {"transformer.h.*.mlp.c_fc", ColwiseParallel{.input_layout = seq, .overlap_chunks = overlap}},
      {"transformer.h.*.mlp.c_proj", RowwiseParallel{.output_layout = seq}},
      {"transformer.ln_f", SequenceParallel{}},
      {"transformer.ln_f", PrepareModuleOutput{.output_layouts = {seq},
                                               .desired_output_layouts = {Replicate{}},
                                               .partial_gradients = true}},
  };
}

}  // namespace tessel
