#pragma once
// The tensor-parallel plan of nn::GPT (GPT-2's layout), written out as a table: Megatron's
// split of every block (attention by heads, MLP by hidden units), a vocabulary-split token
// embedding whose weight is also the LM head, and — with sequence parallelism — the norms,
// dropout and residual stream on sequence shards between the blocks' matmuls.
//
//   parallelize_module(model, mesh["tp"], gpt_tp_plan({.sequence_parallel = true}));
//   Tensor loss = loss_parallel_cross_entropy(model(x), y, mesh["tp"], config.vocab_size);
//
// The logits come out split by vocabulary (the LM head multiplies by this rank's rows of the
// tied wte weight): feed them to loss_parallel_cross_entropy (tessel/parallel/tp/loss.h). The
// sequence length must be a multiple of tp with sequence parallelism; n_head must divide by tp.

#include <cstdint>

#include "tessel/parallel/tp/parallelize.h"

namespace tessel {

struct GptTpOptions {
  bool sequence_parallel = false;
  // > 0 (sequence parallelism only): the all_gathers before c_attn and c_fc are split in this
  // many chunks overlapped with the matmul (ColwiseParallel::overlap_chunks).
  int64_t overlap_chunks = 0;
};

ParallelizePlan gpt_tp_plan(const GptTpOptions& options = {});

}  // namespace tessel
