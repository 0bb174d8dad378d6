#pragma once
// Context parallelism of nn::GPT over a mesh's `cp` dimension: every block's attention runs as
// ring attention (causal, in global positions) over the cp group, and the position embedding
// reads the global positions of this rank's tokens. Each rank then feeds its slice of every
// sequence (cp_shard_batch) and averages its loss as cp_shard_batch says.
//
//   DeviceMesh mesh = init_device_mesh(world, {2, 2, 2}, {"dp_shard", "cp", "tp"});
//   const CpLayout layout = cp_layout_load_balanced(T, mesh.size("cp"));
//   apply_gpt_context_parallel(model, mesh.group("cp"), layout);
//   parallelize_module(model, mesh["tp"], gpt_tp_plan());             // optional, after cp
//   fully_shard(..., mesh.flatten({"dp_shard", "cp"}, "dp_shard_cp"));  // FSDP over dp x cp
//   CpBatch b = cp_shard_batch(x, y, layout, mesh.local_rank("cp"));
//   Tensor loss = mul(GPT::loss(model(b.tokens), b.targets), b.loss_scale);
//
// Gradients: data-parallel averaging over the flattened (dp_shard, cp) group then gives the
// gradient of the loss averaged over the whole sequence (loss_scale corrects uneven slices).

#include <cstdint>
#include <memory>

#include "tessel/collectives/process_group.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/cp/ring_attention.h"
#include "tessel/parallel/cp/sequence_shard.h"

namespace tessel::parallel {

struct GptCpOptions {
  CpAttentionAlgorithm algorithm = CpAttentionAlgorithm::kAuto;
};

// Replaces every "transformer.h.<i>.attn" with a context-parallel attention that keeps its
// children (c_attn, c_proj, resid_dropout: parameter names and a later TP plan unchanged) and
// runs ring_attention over `cp_group`; adds a forward pre-hook to "transformer.wpe" that gives
// it this rank's global positions. Call before parallelize_module and fully_shard. The model
// must then be called with this rank's layout.local_len(rank) tokens per sequence. Every rank
// of the group calls it. Throws InvalidArgument when the layout does not match the group or the
// sequence is longer than block_size.
void apply_gpt_context_parallel(nn::GPT& model, std::shared_ptr<ProcessGroup> cp_group,
                                const CpLayout& layout, const GptCpOptions& options = {});

// One rank's slice of a batch of sequences (B, S) and what its loss needs.
struct CpBatch {
  Tensor tokens;        // (B, S_local)
  Tensor targets;       // (B, S_local)
  Tensor positions;     // i64 (S_local): global positions (for rotary or learned embeddings)
  Tensor document_ids;  // this rank's ids when given (RingAttentionOptions::document_ids)
  // S_local * cp / S: a rank's mean loss times this, averaged over the cp ranks, is the mean
  // over the whole sequence (1 when the slices are equal).
  double loss_scale = 1.0;
};

// Slices tokens, targets and (when defined) document ids ((S) or (B, S)) along the sequence for
// rank `cp_rank` of the layout. Throws InvalidArgument for shapes that do not match the layout.
CpBatch cp_shard_batch(const Tensor& tokens, const Tensor& targets, const CpLayout& layout,
                       int64_t cp_rank, const Tensor& document_ids = Tensor());

}  // namespace tessel::parallel
