#pragma once
// nn::Module: the base of every layer. A module owns named parameters (tensors the optimizer
// updates), buffers (state that is saved but not trained) and submodules; names are dotted
// paths ("transformer.h.0.attn.c_attn.weight"), as in PyTorch, so state dicts interoperate.
//
//   class Scale : public Module {
//    public:
//     Scale() : Module("Scale") { weight_ = &register_parameter("weight", ones({4})); }
//     Tensor forward(const Tensor& x) override { return mul(x, *weight_); }
//    private:
//     Tensor* weight_;  // a slot: set_parameter() swaps what it holds
//   };
//   auto m = std::make_shared<Scale>();
//   Tensor y = (*m)(x);              // runs pre-hooks, forward, post-hooks
//
// Modules with several inputs or outputs override forward_multi() and are called with a list
// (`Tensors out = m({x, mask})`); hooks always see every input and output.
//
// What parallel wrappers build on:
// - Children are reached through the registry (child("c_fc")), never through typed pointers,
//   so set_submodule() can replace a layer (tensor parallelism swaps a Linear for a
//   column-parallel one) and the parent's forward uses the replacement.
// - Parameter slots: set_parameter() replaces what a slot holds; Tensor::set_data() changes a
//   parameter's data in place (to(), to_empty(), a shard), keeping every reference valid.
// - Forward pre-hooks (FSDP all-gathers there) and post-hooks (FSDP reshards there); backward
//   pre-hooks (the gradients of the module's outputs are ready: FSDP all-gathers again) and
//   backward hooks (the gradients of its inputs are ready: FSDP reduce-scatters); autograd's
//   queue_callback() runs code at the end of the whole backward pass.
// - Meta construction: build under DefaultDeviceGuard(Device::meta()) (no memory), then
//   to_empty(device) or replace each parameter's data with only its shard, then initialise.
//
// Thread-safety: none; a module and its tree are used by one thread at a time. Ownership:
// parent modules share ownership of their children (std::shared_ptr), so a child can also be
// held by the caller; tensors are handles (see tensor.h).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessel/tensor/safetensors.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

// Parameters and persistent buffers by dotted name.
using StateDict = TensorMap;
// The inputs or outputs of a module call.
using Tensors = std::vector<Tensor>;

// A handle returned by hook registration; pass it to remove_hook().
struct HookHandle {
  uint64_t id = 0;
};

class Module {
 public:
  // Runs before forward; may replace the inputs.
  using ForwardPreHook = std::function<void(Module& module, Tensors& inputs)>;
  // Runs after forward; may replace the outputs.
  using ForwardHook = std::function<void(Module& module, const Tensors& inputs, Tensors& outputs)>;
  // Runs in backward when the gradients of the module's outputs are known, before any of the
  // module's own backward work; may replace them (zeros where an output got none). Only
  // floating outputs take part.
  using BackwardPreHook = std::function<void(Module& module, Tensors& grad_outputs)>;
  // Runs in backward when the gradients of the module's inputs that require one are known (one
  // entry per such input, in order); may replace them. When no input requires a gradient it
  // runs right after the pre-hooks, with an empty grad_inputs.
  using BackwardHook =
      std::function<void(Module& module, Tensors& grad_inputs, const Tensors& grad_outputs)>;

  explicit Module(std::string type_name);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "Linear", "GPT", ...
  const std::string& type_name() const { return type_name_; }

  // Runs the forward pre-hooks in registration order, forward_multi(), then the forward hooks
  // in registration order; with backward hooks registered (and grad mode on), also arranges
  // for them to run in backward. Hooks registered on submodules fire when their own call runs.
  Tensors operator()(const Tensors& inputs);
  // One input, one output: operator()({input}), which must return exactly one tensor
  // (InvalidArgument otherwise).
  Tensor operator()(const Tensor& input);

  // The computation. Single-tensor modules override forward(); others override
  // forward_multi(), whose default calls forward() with its one input. The default forward()
  // throws NotImplemented (containers have none).
  virtual Tensor forward(const Tensor& input);
  virtual Tensors forward_multi(const Tensors& inputs);

  // --- Parameters, buffers and submodules ------------------------------------------------------
  // Registration. Names are non-empty and dot-free and unique within this module across
  // parameters, buffers and children (InvalidArgument otherwise). The returned reference is a
  // stable slot for the module's own use: set_parameter() replaces what it holds.
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Recursive listings in registration order, children after the module's own entries, with
  // dotted names relative to this module. A tensor reachable under two names (a tied weight)
  // is listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  // This module (name "") and every descendant.
  std::vector<std::pair<std::string, Module*>> named_modules();
  // Direct children.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children() const;
  // The direct child `name`; OutOfRange naming it when absent. Layers call their children
  // through this, so a replacement (set_submodule) takes effect.
  Module& child(std::string_view name) const;
  // The child as M; InvalidArgument naming both types when it is another kind of module.
  template <typename M>
  M& child_as(std::string_view name) const {
    Module& m = child(name);
    M* typed = dynamic_cast<M*>(&m);
    if (typed == nullptr) throw_wrong_type(name, m);
    return *typed;
  }

  // Lookup by dotted name; OutOfRange naming the path when absent.
  Tensor& parameter(std::string_view dotted_name);
  Tensor& buffer(std::string_view dotted_name);
  Module& submodule(std::string_view dotted_name);
  // Replaces the parameter (any shape or dtype: a shard, a slice) in place: the owning module's
  // slot then holds `value`, so its forward uses it. Throws OutOfRange when absent.
  void set_parameter(std::string_view dotted_name, Tensor value);
  // Replaces the submodule at `dotted_name` (its parent's registry entry) with `module`; the
  // parent's forward then calls the new one. Hooks of the old module are not carried over.
  // Throws OutOfRange when absent, InvalidArgument for a null module or an empty name.
  void set_submodule(std::string_view dotted_name, std::shared_ptr<Module> module);

  // Moves every parameter and buffer to `device` / converts the floating ones to `dtype`, in
  // place (Tensor::set_data: optimizers and slots keep their references; gradients dropped).
  // Returns *this.
  Module& to(Device device);
  Module& to(DType dtype);
  // Gives every parameter and buffer fresh uninitialised memory on `device` with its current
  // shape and dtype (for a model built on the meta device); initialise it afterwards.
  Module& to_empty(Device device);

  // Parameters followed by buffers, by dotted name (tied tensors once).
  StateDict state_dict() const;
  // Copies every entry into the module's existing tensors (any strides or device), so slots
  // and optimizer references stay valid. Shapes and dtypes must match. Throws InvalidArgument,
  // before changing anything, listing the missing keys, unexpected keys and mismatched shapes
  // or dtypes.
  void load_state_dict(const StateDict& state);
  // state_dict() to / from a safetensors file.
  void save(const std::string& path, const std::map<std::string, std::string>& metadata = {}) const;
  void load(const std::string& path);

  // Training mode, for dropout and the like; applies to the whole subtree.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops every parameter's gradient (sets it undefined).
  void zero_grad();

  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  HookHandle register_backward_pre_hook(BackwardPreHook hook);
  HookHandle register_backward_hook(BackwardHook hook);
  // Returns false when no hook of this module has that handle.
  bool remove_hook(HookHandle handle);

  // Replaces the plain forward_multi(inputs) that operator() runs between the forward hooks
  // (and inside the backward hooks' identity nodes) by wrapper(*this, inputs), which calls
  // forward_multi() itself: activation checkpointing (nn/activation_checkpoint.h) runs it there
  // without saving activations, and again in backward. A null wrapper restores the plain call.
  using ForwardWrapper = std::function<Tensors(Module& module, const Tensors& inputs)>;
  void set_forward_wrapper(ForwardWrapper wrapper) { forward_wrapper_ = std::move(wrapper); }
  bool has_forward_wrapper() const { return forward_wrapper_ != nullptr; }

  // State a wrapper keeps with the module and that lives as long as it (FSDP's per-module
  // state), by key; null when absent. Setting a null value removes it.
  void set_attachment(const std::string& key, std::shared_ptr<void> value);
  std::shared_ptr<void> attachment(const std::string& key) const;

 private:
  struct Slot {
    std::string name;
    std::unique_ptr<Tensor> value;  // stable address for the module's own pointer
  };

  void add_child(const std::string& name, std::shared_ptr<Module> module);
  [[noreturn]] void throw_wrong_type(std::string_view name, const Module& found) const;
  // forward_multi(), or the forward wrapper when one is set.
  Tensors run_forward(const Tensors& inputs);
  // Wraps inputs and outputs in identity autograd nodes that run the backward hooks.
  Tensors call_with_backward_hooks(const Tensors& inputs);
  // Replaces each parameter's and buffer's data with fn(tensor).
  void map_tensors(const std::function<Tensor(const Tensor&)>& fn);
  void check_new_name(const std::string& name) const;
  // The module owning the last component of `dotted_name`, and that component.
  std::pair<Module*, std::string_view> resolve(std::string_view dotted_name);
  Tensor* find_slot(std::vector<Slot>& slots, std::string_view name);
  template <typename Fn>
  void visit(const std::string& prefix, Fn&& fn) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<Slot> parameters_;
  std::vector<Slot> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<uint64_t, ForwardHook>> post_hooks_;
  std::vector<std::pair<uint64_t, BackwardPreHook>> backward_pre_hooks_;
  std::vector<std::pair<uint64_t, BackwardHook>> backward_hooks_;
  std::map<std::string, std::shared_ptr<void>> attachments_;
  ForwardWrapper forward_wrapper_;
  uint64_t next_hook_id_ = 1;
};

// A list of submodules named "0", "1", ... (GPT's blocks). Items are reached through the
// registry, so set_submodule("3", ...) replaces the fourth.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(size_), module);
    ++size_;
    return module;
  }
  size_t size() const { return size_; }
  Module& operator[](size_t i) const;

 private:
  size_t size_ = 0;
};

}  // namespace tessel::nn
