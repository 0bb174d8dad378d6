#pragma once
// Context parallelism of nn::Llama over a mesh's `cp` dimension: every decoder layer's attention
// runs as ring attention (causal, grouped-query, in global positions) over the cp group, and the
// rotary embedding reads this rank's global positions (the model called with tokens alone adds
// them; CpBatch::positions are the same).
//
//   apply_llama_context_parallel(model, mesh.group("cp"), layout);
//   CpBatch b = cp_shard_batch(x, y, layout, mesh.local_rank("cp"));
//   Tensor logits = model(b.tokens);   // or model({b.tokens, b.positions})
//   Tensor loss = mul(Llama::loss(logits, b.targets), b.loss_scale);

#include <memory>

#include "tessel/collectives/process_group.h"
#include "tessel/nn/llama.h"
#include "tessel/parallel/cp/gpt_cp.h"
#include "tessel/parallel/cp/ring_attention.h"
#include "tessel/parallel/cp/sequence_shard.h"

namespace tessel::parallel {

// Replaces every "model.layers.<i>.self_attn" with a context-parallel attention that keeps its
// projections (q_proj, k_proj, v_proj, o_proj: names and a later TP plan unchanged) and runs
// ring_attention over `cp_group`, and adds a forward pre-hook to the model that appends this
// rank's global positions when it is called with tokens alone. Call before parallelize_module
// and fully_shard; then call the model with this rank's layout.local_len(rank) tokens. Every rank
// of the group calls it. Throws InvalidArgument when the layout does not match the group or the
// sequence is longer than max_seq_len.
void apply_llama_context_parallel(nn::Llama& model, std::shared_ptr<ProcessGroup> cp_group,
                                  const CpLayout& layout, const GptCpOptions& options = {});

}  // namespace tessel::parallel
