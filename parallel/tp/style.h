#pragma once
// Tensor-parallel styles: how parallelize_module (tessel/parallel/tp/parallelize.h) lays out one
// module over the tensor-parallel group, with PyTorch's names. Each is a plain options struct:
//
//   {"transformer.h.*.attn.c_attn", ColwiseParallel{.input_layout = Shard(1), .sections = 3}}
//
// Layouts describe an activation at a module's boundary along the tp group: Replicate() (every
// rank holds all of it), Shard(d) (each rank its piece of dimension d: Shard(1) is a sequence
// shard, Shard(-1) a feature shard) or, as an input only, Partial() (each rank holds a partial
// sum). At a boundary a gradient has its activation's layout; the styles place the collectives
// (tessel/parallel/tp/regions.h) that keep it so.

#include <cstdint>
#include <optional>
#include <vector>

#include "tessel/parallel/dtensor/placement.h"

namespace tessel {

// A Linear split by output features (weight rows, bias): y_local = x W_local^T + b_local.
// Replaced by a ColumnParallelLinear (tessel/parallel/tp/layers.h).
struct ColwiseParallel {
  // Replicate(): copy_to_tp_region (all_reduce of the input's gradient in backward);
  // Shard(d) (sequence parallel): all_gather along d, reduce_scatter of the gradient.
  Placement input_layout = Replicate{};
  // Shard(-1): each rank keeps its output features (for a RowwiseParallel layer or loss
  // parallelism); Replicate(): all_gathered (uneven splits exact).
  Placement output_layout = Shard{-1};
  // Fused projections: the weight's rows are `sections` equal blocks (GPT-2's c_attn: q, k, v)
  // and each block is split across the group separately, so every rank holds its q, k and v.
  // The parameters become (sections, rows, in) and (sections, rows): their DTensor is that view
  // of the whole, Shard(1); state dicts gathered by full_state_dict have the module's shapes.
  int64_t sections = 1;
  // > 0 with a Shard input: the all_gather is split in this many asynchronous chunks so this
  // rank's own rows are multiplied while the others travel (all_gather_linear). 0: one
  // blocking all_gather.
  int64_t overlap_chunks = 0;
};

// A Linear split by input features (weight columns): y = sum over ranks of x_local W_local^T,
// then + b; or an Embedding split by vocabulary rows (Megatron's VocabParallelEmbedding): each
// rank looks up the tokens of its rows, zeros elsewhere, then the sum. Replaced by a
// RowParallelLinear / VocabParallelEmbedding (tessel/parallel/tp/layers.h).
struct RowwiseParallel {
  // Linear: Shard(-1) (the output of a ColwiseParallel layer; the default) or Replicate()
  // (this rank's piece is kept; all_gather of the gradient). Embedding: Replicate() tokens
  // (the default). nullopt: the module's default.
  std::optional<Placement> input_layout;
  // Replicate(): all_reduce (gradient unchanged); Shard(d) (sequence parallel):
  // reduce_scatter along d (all_gather of the gradient), the bias added to the shard.
  Placement output_layout = Replicate{};
};

// The module runs on sequence shards as it is (norms, dropout): its parameters stay whole on
// every rank and their gradients — each rank's share from its shard — are summed over the group
// in backward. Inputs and outputs pass unchanged (they are Shard(sequence_dim) already). Under
// FSDP, shard the module with its block (fully_shard on the module alone is refused at forward).
struct SequenceParallel {
  int64_t sequence_dim = 1;
};

// Converts a module's inputs / outputs between layouts before / after it runs; nullopt leaves
// one unchanged. Replicate <-> Shard(d) is a slice or an all_gather (the gradient's dual),
// Partial -> Replicate / Shard(d) an all_reduce / reduce_scatter.
//
// partial_gradients: the converted tensor feeds a tensor-parallel computation directly (a
// matmul with a weight split over the group: GPT's tied LM head on a vocabulary-split
// embedding), so each rank's gradient is a partial sum, reduced by backward — all_reduce into
// a Replicate layout, reduce_scatter into Shard(d) when the input was Shard(d). Needs desired
// layouts that are Replicate.
struct PrepareModuleInput {
  std::vector<std::optional<Placement>> input_layouts;
  std::vector<std::optional<Placement>> desired_input_layouts;
  bool partial_gradients = false;
};

struct PrepareModuleOutput {
  std::vector<std::optional<Placement>> output_layouts;
  std::vector<std::optional<Placement>> desired_output_layouts;
  bool partial_gradients = false;
};

}  // namespace tessel
