#pragma once
// Reverse-mode automatic differentiation. Ops record a Node per differentiable call when grad
// mode is on and an input requires a gradient; backward() walks that graph from a root and
// accumulates gradients into leaves (tensors created by the user with set_requires_grad).
//
//   Tensor w = randn({4, 3}).set_requires_grad(true);
//   Tensor loss = sum(mul(matmul(x, w), y));
//   backward(loss);                       // w.grad() now holds d loss / d w
//   { NoGradGuard no_grad; update(w); }   // ops inside record nothing
//
// Determinism: backward runs on the calling thread in a fixed order (nodes by creation order,
// newest first, leaf accumulation as soon as a leaf's gradient is complete) and sums gradients
// in a fixed order, so repeated runs give bitwise-identical gradients.
// Limits: backward functions run with grad mode off (no double backward); in-place changes to a
// tensor saved for backward between forward and backward are not detected.
//
// Thread-safety: grad mode is per thread. Building graphs on several threads is fine; one graph
// must not be back-propagated by two threads at once.

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel {

// Where a gradient flows: input slot `input_nr` of `node` (null node: nowhere).
struct Edge {
  std::shared_ptr<Node> node;
  int input_nr = 0;
};

// A recorded operation: takes the gradients of its outputs, returns the gradients of its inputs.
// Owned by shared_ptr from the tensors it produced and from the nodes downstream of it.
struct Node {
  // Shape/dtype of each output, used to check incoming gradients and to make zero gradients.
  struct OutputMeta {
    Shape shape;
    DType dtype = DType::kF32;
    Device device;
  };

  explicit Node(std::string name);
  virtual ~Node() = default;
  // Gradients for next_edges (one each; undefined = no gradient), from the gradients of the
  // outputs (one per output, zeros where an output received none). Runs with grad mode off.
  virtual std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) = 0;
  // Frees saved state after a backward pass without retain_graph.
  virtual void release() {}

  std::string name;
  uint64_t sequence_nr;  // creation order; backward runs newer nodes first
  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  // Hooks on the gradient of output i of this node (tensor hooks of non-leaf tensors).
  std::vector<std::pair<int, std::function<Tensor(const Tensor&)>>> pre_hooks;
};

// ---- Grad mode -------------------------------------------------------------------------------

// Whether ops record the graph on this thread (default true).
bool grad_enabled();
void set_grad_enabled(bool enabled);

// Turns grad mode off for its scope on this thread (like torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- Backward --------------------------------------------------------------------------------

// Back-propagates from `root`. `gradient` is d(something)/d(root) with root's shape; it may be
// left undefined only when root has one element (then it is 1). Gradients are accumulated
// (added) into the grad() of every leaf reached that requires a gradient. Saved tensors are
// freed afterwards unless retain_graph. Blocks until done; runs on the calling thread.
// Throws InvalidArgument when root does not require a gradient, when root is not a scalar and
// no gradient is given, or when the gradient's shape differs from root's.
void backward(const Tensor& root, const Tensor& gradient = Tensor(), bool retain_graph = false);

// Queues `callback` to run when the backward() now running on this thread has processed the
// whole graph, before it returns (FSDP waits for its gradient reductions there). Callbacks run
// in the order queued, on the thread that called backward(); one may queue another. Throws
// InvalidArgument outside a backward pass.
void queue_callback(std::function<void()> callback);
// True while a backward() runs on this thread (in hooks and backward functions).
bool in_backward();

// A new tensor sharing root's storage but not its history (requires_grad false).
Tensor detach(const Tensor& t);

// A leaf that requires a gradient, or an op result in the graph.
bool is_leaf(const Tensor& t);
// The node that produced t (null for leaves and tensors outside the graph).
std::shared_ptr<Node> grad_fn(const Tensor& t);

// ---- Hooks -----------------------------------------------------------------------------------

// Called with the gradient flowing into t; return an undefined Tensor to keep it, or a tensor
// of the same shape to replace it. For a leaf it runs before accumulation, for an op result
// before its node runs. t must require a gradient.
using GradHook = std::function<Tensor(const Tensor& grad)>;
void register_hook(const Tensor& t, GradHook hook);

// Called with the leaf after its grad() has received this pass's full gradient — the moment
// a data-parallel wrapper can start reducing it (FSDP's reduce-scatter, DDP's all-reduce).
// Runs during backward(), on the thread that called backward().
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);

// Removes every hook registered on t.
void clear_hooks(const Tensor& t);

// ---- Custom differentiable ops ---------------------------------------------------------------

// State shared by a custom op's forward and backward (like torch.autograd.Function's ctx).
class FunctionContext {
 public:
  // Keeps tensors for backward (stored without their history, so no reference cycles).
  void save_for_backward(const std::vector<Tensor>& tensors);
  // The saved tensors. Throws InvalidArgument after the graph was freed by backward().
  const std::vector<Tensor>& saved_tensors() const;
  // Whether input i requires a gradient (backward may return undefined for the others).
  bool needs_input_grad(size_t i) const;
  size_t num_inputs() const { return needs_input_grad_.size(); }
  // Any non-tensor state forward wants to hand to backward.
  std::any data;

 private:
  friend struct FunctionContextAccess;  // apply_function's helper in autograd.cc
  std::vector<Tensor> saved_;
  std::vector<bool> needs_input_grad_;
  bool released_ = false;
};

using FunctionForward =
    std::function<std::vector<Tensor>(FunctionContext& ctx, const std::vector<Tensor>& inputs)>;
// Returns one gradient per input (undefined where none), given one gradient per output
// (zeros for outputs that received none).
using FunctionBackward = std::function<std::vector<Tensor>(
    FunctionContext& ctx, const std::vector<Tensor>& grad_outputs)>;

// Runs forward (with grad mode off) and, when grad mode is on and an input requires a gradient,
// records a node named `name` whose backward is `backward`. Returns forward's outputs.
//
//   auto out = apply_function("scaled_tanh", {x},
//       [](FunctionContext& ctx, const std::vector<Tensor>& in) {
//         Tensor y = tanh(in[0]);
//         ctx.save_for_backward({y});
//         return std::vector<Tensor>{mul(y, 2.0)};
//       },
//       [](FunctionContext& ctx, const std::vector<Tensor>& grad) {
//         Tensor y = ctx.saved_tensors()[0];
//         return std::vector<Tensor>{mul(grad[0], mul(sub(1.0, mul(y, y)), 2.0))};
//       });
std::vector<Tensor> apply_function(std::string_view name, const std::vector<Tensor>& inputs,
                                   const FunctionForward& forward, FunctionBackward backward);

// ---- Selective recomputation --------------------------------------------------------------

// The outputs of the expensive ops of one forward, kept for its recomputation (the selective
// policy of nn/activation_checkpoint.h: keep what matmuls and attention produced, recompute the
// pointwise ops). While a cache is installed on this thread (OpOutputCacheGuard), the ops that
// consult it — linear, matmul and scaled_dot_product_attention — append their outputs to it in
// Mode::kStore, and in Mode::kReplay take the stored ones, in the same order, instead of
// computing them (autograd still records them with the recomputed inputs). Other ops ignore it.
// Thread-safety: none; a cache is used by the thread it is installed on.
class OpOutputCache {
 public:
  enum class Mode { kStore, kReplay };

  explicit OpOutputCache(Mode mode = Mode::kStore) : mode_(mode) {}
  Mode mode() const { return mode_; }
  void set_mode(Mode mode) { mode_ = mode; }
  // Entries not taken yet, and their bytes.
  size_t size() const { return entries_.size() - next_; }
  int64_t bytes() const;

  // For ops: appends `op`'s outputs (kept without their history).
  void store(std::string_view op, const std::vector<Tensor>& outputs);
  // For ops: the next stored outputs, dropped from the cache. Throws InvalidArgument when none
  // is left or the next entry was stored by another op (the recomputed forward did not take
  // the path of the first).
  std::vector<Tensor> take(std::string_view op);

 private:
  struct Entry {
    std::string op;
    std::vector<Tensor> outputs;
  };
  Mode mode_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
};

// Installs `cache` (may be null: none) on this thread for its scope; restores the previous one.
class OpOutputCacheGuard {
 public:
  explicit OpOutputCacheGuard(OpOutputCache* cache);
  ~OpOutputCacheGuard();
  OpOutputCacheGuard(const OpOutputCacheGuard&) = delete;
  OpOutputCacheGuard& operator=(const OpOutputCacheGuard&) = delete;

 private:
  OpOutputCache* previous_;
};

// The cache installed on this thread, or null.
OpOutputCache* op_output_cache();

// ---- For op authors ----------------------------------------------------------------------------

// True when grad mode is on and some input requires a gradient.
bool needs_grad(const std::vector<Tensor>& inputs);
bool needs_grad(const Tensor& input);  // one input, with no vector to build
// Gradient function of a recorded op: gradients of the inputs from those of the outputs.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
// Makes `outputs` (fresh tensors, not aliases of inputs' handles) results of a new node with
// edges to `inputs`. Call only when needs_grad(inputs). Capture saved tensors with detach().
void record_op(std::string_view name, const std::vector<Tensor>& inputs,
               const std::vector<Tensor>& outputs, BackwardFn backward);

}  // namespace tessel
