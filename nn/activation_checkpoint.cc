#include "tessel/nn/activation_checkpoint.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/dropout.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {
namespace {

// A generator's position: its seed and the offset of its next draw.
struct GeneratorState {
  Generator* gen;
  uint64_t seed;
  uint64_t offset;
};

// The generators the module's dropouts draw masks from, each once.
std::vector<Generator*> dropout_generators(Module& module) {
  std::vector<Generator*> out;
  for (auto& [name, m] : module.named_modules()) {
    const auto* dropout = dynamic_cast<const Dropout*>(m);
    if (dropout == nullptr || dropout->p() == 0) continue;
    Generator* gen = &dropout->generator();
    if (std::find(out.begin(), out.end(), gen) == out.end()) out.push_back(gen);
  }
  return out;
}

std::vector<GeneratorState> save_rng(const std::vector<Generator*>& gens) {
  std::vector<GeneratorState> out;
  for (Generator* g : gens) out.push_back({g, g->seed(), g->offset()});
  return out;
}

void restore_rng(const std::vector<GeneratorState>& states) {
  for (const GeneratorState& s : states) {
    s.gen->manual_seed(s.seed);
    s.gen->reserve(s.offset);
  }
}

// Grad mode on for its scope (backward functions run with it off).
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// What one checkpointed call hands from its forward to its backward, besides its inputs.
struct CallState {
  std::vector<Generator*> generators;
  std::vector<GeneratorState> rng;      // before the first forward
  AutocastGuard::Slot autocast[2];      // CPU, CUDA
  std::unique_ptr<OpOutputCache> kept;  // selective: the outputs of matmuls and attention
};

// The gradients of `inputs` (undefined where none) by running module's forward again and
// back-propagating `grads` (one per output) through it.
Tensors recompute_and_backward(Module& module, CallState& state, const FunctionContext& ctx,
                               const Tensors& grads) {
  const Tensors& saved = ctx.saved_tensors();
  Tensors leaves;
  for (size_t i = 0; i < saved.size(); ++i) {
    Tensor x = detach(saved[i]);
    if (x.defined() && is_floating(x.dtype()) && ctx.needs_input_grad(i)) {
      x.set_requires_grad(true);
    }
    leaves.push_back(x);
  }
  Tensors outputs;
  {
    // Step 1: the forward again, with the first forward's dropout offsets and autocast policy.
    const std::vector<GeneratorState> now = save_rng(state.generators);
    restore_rng(state.rng);
    EnableGradGuard grad_on;
    AutocastGuard cpu(DeviceType::kCPU, state.autocast[0].dtype, state.autocast[0].enabled);
    AutocastGuard cuda(DeviceType::kCUDA, state.autocast[1].dtype, state.autocast[1].enabled);
    if (state.kept) state.kept->set_mode(OpOutputCache::Mode::kReplay);
    OpOutputCacheGuard replay(state.kept.get());
    outputs = module.forward_multi(leaves);
    restore_rng(now);
  }
  state.kept.reset();
  // Step 2: back-propagate the outputs' gradients through the rebuilt graph.
  std::vector<size_t> live;
  for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad() && grads[i].defined()) live.push_back(i);
  }
  if (live.size() == 1) {
    backward(outputs[live[0]], grads[live[0]]);
  } else if (live.size() > 1) {
    // One root whose gradient into each output is exactly that output's gradient.
    Tensor root;
    {
      EnableGradGuard grad_on;
      for (size_t i : live) {
        Tensor term = sum(mul(outputs[i], detach(grads[i])));
        root = root.defined() ? add(root, term) : term;
      }
    }
    backward(root);
  }
  // Step 3: the inputs' gradients go on in the outer pass.
  Tensors input_grads(saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    if (leaves[i].defined() && leaves[i].requires_grad()) input_grads[i] = leaves[i].grad();
  }
  return input_grads;
}

Tensors checkpointed_forward(Module& module, CheckpointPolicy policy, const Tensors& inputs) {
  if (!needs_grad(inputs)) return module.forward_multi(inputs);
  auto state = std::make_shared<CallState>();
  state->generators = dropout_generators(module);
  state->rng = save_rng(state->generators);
  state->autocast[0] = {autocast_enabled(DeviceType::kCPU), autocast_dtype(DeviceType::kCPU)};
  state->autocast[1] = {autocast_enabled(DeviceType::kCUDA), autocast_dtype(DeviceType::kCUDA)};
  if (policy == CheckpointPolicy::kSelective) {
    state->kept = std::make_unique<OpOutputCache>(OpOutputCache::Mode::kStore);
  }
  Module* m = &module;
  return apply_function(
      "ActivationCheckpoint", inputs,
      [m, state](FunctionContext& ctx, const Tensors& in) {
        // Runs under NoGradGuard: nothing is recorded, so nothing is saved.
        OpOutputCacheGuard keep(state->kept.get());
        Tensors out = m->forward_multi(in);
        ctx.save_for_backward(in);
        return out;
      },
      [m, state](FunctionContext& ctx, const Tensors& grads) {
        return recompute_and_backward(*m, *state, ctx, grads);
      });
}

}  // namespace

CheckpointPolicy parse_checkpoint_policy(std::string_view name) {
  if (name == "none") return CheckpointPolicy::kNone;
  if (name == "full") return CheckpointPolicy::kFull;
  if (name == "selective") return CheckpointPolicy::kSelective;
  throw InvalidArgument(fmt::format(
      "activation checkpointing policy '{}' is not one of none, full, selective", name));
}

std::string_view checkpoint_policy_name(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::kNone:
      return "none";
    case CheckpointPolicy::kFull:
      return "full";
    case CheckpointPolicy::kSelective:
      return "selective";
  }
  return "?";
}

void checkpoint_module(Module& module, CheckpointPolicy policy) {
  if (policy == CheckpointPolicy::kNone) {
    module.set_forward_wrapper(nullptr);
    return;
  }
  module.set_forward_wrapper([policy](Module& m, const Tensors& inputs) {
    return checkpointed_forward(m, policy, inputs);
  });
}

int64_t checkpoint_blocks(Module& model, CheckpointPolicy policy) {
  Module* blocks = nullptr;
  for (const char* path : {"transformer.h", "model.layers"}) {
    try {
      blocks = &model.submodule(path);
      break;
    } catch (const OutOfRange&) {
    }
  }
  TESSEL_CHECK(blocks != nullptr, InvalidArgument,
               "checkpoint_blocks: {} has neither transformer.h (GPT) nor model.layers (Llama)",
               model.type_name());
  int64_t n = 0;
  for (auto& [name, block] : blocks->children()) {
    checkpoint_module(*block, policy);
    ++n;
  }
  return n;
}

}  // namespace tessel::nn
