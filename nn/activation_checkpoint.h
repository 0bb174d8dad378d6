#pragma once
// Activation checkpointing: a module's forward runs without keeping the activations its backward
// needs, and runs again in backward to rebuild them (torch.utils.checkpoint), fully or keeping
// the outputs of matmuls and attention (selective, as torchtitan's op-level policy).
//
//   nn::GPT model(config);
//   nn::checkpoint_blocks(model, nn::CheckpointPolicy::kFull);   // every transformer block
//   Tensor loss = nn::GPT::loss(model(tokens), targets);         // keeps only each block's input
//   backward(loss);                                              // recomputes block by block
//
// How it runs (the reentrant scheme): the module's forward_multi() runs under NoGradGuard inside
// one autograd node whose inputs are the module's inputs; in backward that node runs the forward
// again, with grad mode on, on detached copies of the inputs, and back-propagates through the
// recomputed graph there (a backward() inside backward): parameters accumulate their gradients
// in that inner pass (post-accumulate-grad hooks fire there), the inputs' gradients go on in the
// outer pass. The gradients are bit-identical to a run without checkpointing: the same kernels
// see the same values in the same order.
// - Dropout: each Dropout module's generator (below the module) is put back to its offset of the
//   first forward for the recomputation, and afterwards to where it was, so masks are identical
//   and later draws unchanged. Modules drawing with the process-wide default generator must not
//   be recomputed on several threads at once (give each model its own, as GPT and Llama do).
// - Autocast: the recomputation runs under the autocast policy of the first forward.
// - Hooks: the module's own hooks run once, around the first forward; its submodules' hooks run
//   in both forwards. Under FSDP the module's backward pre-hook gathers its parameters before
//   the recomputation (and submodules sharded on their own gather again in their forward
//   pre-hooks); DDP ignores forwards inside backward; tensor-parallel layers issue their
//   forward collectives again (every rank recomputes the same blocks in the same order).
// - A call where grad mode is off or no input requires a gradient runs as a plain forward (the
//   node would have no edge to reach the parameters through).
// - Selective: while the module first runs, linear, matmul and scaled_dot_product_attention
//   keep their outputs (tensor/autograd.h's OpOutputCache); the recomputation takes them instead
//   of computing them, and recomputes the pointwise ops (norms, GELU/SwiGLU, RoPE, dropout, adds).
//
// Thread-safety: as Module. Ownership: the module holds its wrapper; each call's saved state
// lives in its autograd node.

#include <cstdint>
#include <string_view>

#include "tessel/nn/module.h"

namespace tessel::nn {

enum class CheckpointPolicy {
  kNone,       // keep every activation (no checkpointing)
  kFull,       // keep the module's inputs only; recompute the whole forward
  kSelective,  // also keep the outputs of linear, matmul and attention; recompute the rest
};

// "none", "full", "selective" <-> the policy. Throws InvalidArgument naming the text and the
// accepted names.
CheckpointPolicy parse_checkpoint_policy(std::string_view name);
std::string_view checkpoint_policy_name(CheckpointPolicy policy);

// Makes every later call of `module` (its operator()) checkpointed under `policy`; kNone
// restores the plain forward. Apply it before or after fully_shard / replicate /
// parallelize_module on the same module (it replaces only the call of forward_multi(), inside
// their hooks). The module must not be a submodule of another checkpointed module.
void checkpoint_module(Module& module, CheckpointPolicy policy);

// checkpoint_module on every transformer block of a GPT ("transformer.h.N") or a Llama
// ("model.layers.N"); returns how many. Throws InvalidArgument for a model with neither list.
int64_t checkpoint_blocks(Module& model, CheckpointPolicy policy);

}  // namespace tessel::nn
