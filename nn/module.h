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
// Parallel wrappers build on three hook points: a parameter slot can be replaced in place
// (FSDP swaps in a shard, TP a column slice), forward pre-hooks run before forward (FSDP
// all-gathers there) and forward post-hooks after it (FSDP reshards there, and can attach
// gradient hooks to the output).
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

// A handle returned by hook registration; pass it to remove_hook().
struct HookHandle {
  uint64_t id = 0;
};

class Module {
 public:
  // Runs before forward; may replace the input.
  using ForwardPreHook = std::function<void(Module& module, Tensor& input)>;
  // Runs after forward; may replace the output.
  using ForwardHook = std::function<void(Module& module, const Tensor& input, Tensor& output)>;

  explicit Module(std::string type_name);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "Linear", "GPT", ...
  const std::string& type_name() const { return type_name_; }

  // Runs the forward pre-hooks in registration order, forward(), then the forward hooks in
  // registration order. Hooks registered on submodules fire when their own operator() runs.
  Tensor operator()(const Tensor& input);
  // The computation. The default throws NotImplemented (containers have none).
  virtual Tensor forward(const Tensor& input);

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

  // Lookup by dotted name; OutOfRange naming the path when absent.
  Tensor& parameter(std::string_view dotted_name);
  Tensor& buffer(std::string_view dotted_name);
  Module& submodule(std::string_view dotted_name);
  // Replaces the parameter (any shape or dtype: a shard, a slice) in place: the owning module's
  // slot then holds `value`, so its forward uses it. Throws OutOfRange when absent.
  void set_parameter(std::string_view dotted_name, Tensor value);

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
  // Returns false when no hook of this module has that handle.
  bool remove_hook(HookHandle handle);

 private:
  struct Slot {
    std::string name;
    std::unique_ptr<Tensor> value;  // stable address for the module's own pointer
  };

  void add_child(const std::string& name, std::shared_ptr<Module> module);
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
  uint64_t next_hook_id_ = 1;
};

// A list of submodules named "0", "1", ... (GPT's blocks).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(items_.size()), module);
    items_.push_back(module);
    return module;
  }
  size_t size() const { return items_.size(); }
  Module& operator[](size_t i) const { return *items_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace tessel::nn
