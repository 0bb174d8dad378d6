#pragma once
// parallelize_module: tensor (and sequence) parallelism applied to a model by a plan — a table of
// module paths and the style of each (tessel/parallel/tp/style.h), as PyTorch's
// parallelize_module and torchtitan's per-model plans:
//
//   DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "tp"});
//   parallelize_module(model, mesh["tp"], {
//       {"transformer.wte", RowwiseParallel{.input_layout = Replicate()}},
//       {"transformer.h.*.attn.c_attn", ColwiseParallel{.sections = 3}},
//       {"transformer.h.*.attn.c_proj", RowwiseParallel{}},
//       {"transformer.h.*.mlp.c_fc", ColwiseParallel{}},
//       {"transformer.h.*.mlp.c_proj", RowwiseParallel{}},
//       {"transformer.ln_f", PrepareModuleOutput{{Replicate()}, {Replicate()}, true}},
//   });
//   fully_shard(...) over mesh["dp"] next, if wanted (FSDP composes: fsdp/fsdp.h).
//   Tensor loss = loss_parallel_cross_entropy(model(x), y, mesh["tp"], vocab);   // loss.h
//
// Paths are dotted module names; a component "*" matches any one name ("transformer.h.*.mlp"
// is every block's MLP). Several entries may name one module; ColwiseParallel and
// RowwiseParallel replace the module (through the registry, set_submodule: its parent's
// forward calls the tensor-parallel layer), the other styles register forward hooks on it.
// Replacements are applied first, then the hooks, each in plan order.
//
// Attention: a CausalSelfAttention's c_attn packs q, k and v and must be ColwiseParallel with
// sections = 3; each rank then runs n_head / tp heads (the attention derives its local heads
// from c_attn's output), so the heads must divide over the group. A LlamaAttention's q_proj,
// k_proj and v_proj are plain ColwiseParallel: its query heads and its K/V heads must each divide
// over the group (llama_plan.h). Vocabularies and feature sizes may split unevenly (exact).
//
// Every check — the mesh, each path, each style against its module, the heads — runs before
// anything changes and needs no communication, so a bad plan fails on every rank with the same
// InvalidArgument naming the problem. parallelize_module makes no communication; forward and
// backward then issue the styles' collectives on the tp group (regions.h). Apply it before
// fully_shard. Thread-safety: none (the model is used by one thread).

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/tp/style.h"

namespace tessel {

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel,
                                   PrepareModuleInput, PrepareModuleOutput>;
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

struct ParallelizeOptions {
  // The mesh dimension to split over; `mesh` must have it (a 1-D mesh["tp"] or a larger mesh).
  std::string tp_dim = "tp";
};

// Applies `plan` to `module` over mesh dimension options.tp_dim (see above). Throws
// InvalidArgument for a mesh without that dimension, a path that names no module (naming the
// closest module and its children), a style that does not fit its module (ColwiseParallel on a
// LayerNorm), heads that do not divide over the group, a parameter that is already a shard, or
// a model already under fully_shard.
void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        const ParallelizeOptions& options = {});

// The layout conversion PrepareModuleInput/Output apply to one tensor (see style.h): from
// `from` to `to` on `tp_mesh`'s group, differentiable, with partial_gradients' meaning.
Tensor prepare_layout(const Tensor& x, const DeviceMesh& tp_mesh, const Placement& from,
                      const Placement& to, bool partial_gradients = false);

}  // namespace tessel
