#include "tessel/tensor/autograd.h"

#include <atomic>
#include <map>
#include <queue>
#include <unordered_map>

#include "tessel/base/error.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/deferred_grad.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

thread_local bool t_grad_enabled = true;
// The end-of-backward callbacks of the backward() running on this thread (null outside one).
thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;
thread_local OpOutputCache* t_op_output_cache = nullptr;
std::atomic<uint64_t> g_next_sequence_nr{0};

Node::OutputMeta meta_of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }

// A node whose backward is a function; release() drops the function and what it captured.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn, std::function<void()> on_release)
      : Node(std::move(name)), fn_(std::move(fn)), on_release_(std::move(on_release)) {}

  std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) override {
    TESSEL_CHECK(fn_ != nullptr, InvalidArgument,
                 "backward through {} a second time: its saved tensors were freed by the first "
                 "backward(); pass retain_graph=true to keep them",
                 name);
    return fn_(grad_outputs);
  }
  void release() override {
    fn_ = nullptr;
    if (on_release_) on_release_();
  }

 private:
  BackwardFn fn_;
  std::function<void()> on_release_;
};

// The sink of a leaf: runs the leaf's hooks and adds the gradient into leaf.grad().
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
    sequence_nr = UINT64_MAX;  // accumulate as soon as a leaf's gradient is complete
    outputs.push_back(meta_of(leaf_));
  }

  std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) override {
    Tensor g = std::move(grad_outputs[0]);
    AutogradMeta& meta = leaf_.ensure_autograd_meta();
    for (const auto& hook : meta.grad_hooks) {
      Tensor replaced = hook(g);
      if (replaced.defined()) g = replaced;
    }
    if (!meta.grad.defined()) {
      meta.grad = owned_exclusively(g) ? g : fresh_copy(g);
    } else {
      backend_for(meta.grad.device())
          .binary(BinaryOp::kAdd, meta.grad, to(g, meta.grad.dtype()), meta.grad);
    }
    for (const auto& hook : meta.post_accumulate_grad_hooks) hook(leaf_);
    return {};
  }

 private:
  // Whether g can become the leaf's gradient as it is (like PyTorch, which steals it): of the
  // leaf's shape, dtype and device, contiguous over its whole storage, and held by nothing
  // else — no other handle or view (the same gradient may also be on its way to another leaf).
  bool owned_exclusively(const Tensor& g) const {
    return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
           g.shape() == leaf_.shape() && g.dtype() == leaf_.dtype() &&
           g.device() == leaf_.device() && g.is_contiguous() && g.offset() == 0 &&
           g.storage().bytes() == g.nbytes() && g.autograd_meta() == nullptr;
  }
  Tensor fresh_copy(const Tensor& g) const {
    Tensor fresh = empty(leaf_.shape(), leaf_.dtype(), leaf_.device());
    copy_(fresh, g);
    return fresh;
  }

  Tensor leaf_;
};

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& meta = leaf.ensure_autograd_meta();
  std::shared_ptr<Node> node = meta.grad_accumulator.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(leaf);
    meta.grad_accumulator = node;
  }
  return node;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  const AutogradMeta* meta = t.autograd_meta();
  if (meta->grad_fn) return {meta->grad_fn, meta->output_nr};
  return {grad_accumulator(t), 0};
}

// Checks a gradient against the output it belongs to and converts its dtype if needed.
Tensor conform(const Tensor& grad, const Node& node, int slot) {
  const Node::OutputMeta& m = node.outputs[slot];
  TESSEL_CHECK(grad.shape() == m.shape, Internal,
               "gradient of shape {} reached output {} of {} whose shape is {}",
               shape_str(grad.shape()), slot, node.name, shape_str(m.shape));
  return grad.dtype() == m.dtype ? grad : to(grad, m.dtype);
}

// Installs a pass's queue of end-of-backward callbacks on this thread for its scope.
struct CallbackScope {
  std::vector<std::function<void()>>* previous;
  explicit CallbackScope(std::vector<std::function<void()>>* mine) : previous(t_callbacks) {
    t_callbacks = mine;
  }
  ~CallbackScope() { t_callbacks = previous; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
};

// A callback may queue another; runs until the queue is empty, in order.
void run_callbacks(std::vector<std::function<void()>>& callbacks) {
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> callback = std::move(callbacks[i]);
    callback();
  }
}

struct ByNewest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

}  // namespace

Node::Node(std::string node_name)
    : name(std::move(node_name)), sequence_nr(g_next_sequence_nr.fetch_add(1)) {}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

Tensor detach(const Tensor& t) {
  if (!t.defined()) return t;
  return t.as_strided(t.shape(), t.strides(), t.offset());
}

bool is_leaf(const Tensor& t) {
  const AutogradMeta* meta = t.autograd_meta();
  return meta == nullptr || meta->grad_fn == nullptr;
}

std::shared_ptr<Node> grad_fn(const Tensor& t) {
  const AutogradMeta* meta = t.autograd_meta();
  return meta ? meta->grad_fn : nullptr;
}

bool needs_grad(const Tensor& input) {
  return grad_enabled() && input.defined() && input.requires_grad();
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

namespace {
void record_node(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs) {
  for (const Tensor& in : inputs) node->next_edges.push_back(gradient_edge(in));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->outputs.push_back(meta_of(out));
    if (!is_floating(out.dtype())) continue;
    AutogradMeta& meta = out.ensure_autograd_meta();
    TESSEL_CHECK(meta.grad_fn == nullptr && !meta.requires_grad, InvalidArgument,
                 "{}: output {} is already in the autograd graph (return a new tensor or view, "
                 "not an input)",
                 node->name, i);
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = static_cast<int>(i);
  }
}
}  // namespace

void record_op(std::string_view name, const std::vector<Tensor>& inputs,
               const std::vector<Tensor>& outputs, BackwardFn backward) {
  auto node = std::make_shared<FunctionNode>(std::string(name), std::move(backward), nullptr);
  record_node(node, inputs, outputs);
}

void register_hook(const Tensor& t, GradHook hook) {
  TESSEL_CHECK(t.requires_grad(), InvalidArgument,
               "register_hook on {} which does not require a gradient", t.str());
  AutogradMeta& meta = t.ensure_autograd_meta();
  if (meta.grad_fn) {
    meta.grad_fn->pre_hooks.emplace_back(meta.output_nr, std::move(hook));
  } else {
    meta.grad_hooks.push_back(std::move(hook));
  }
}

void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  TESSEL_CHECK(leaf.requires_grad() && is_leaf(leaf), InvalidArgument,
               "post-accumulate-grad hooks need a leaf that requires a gradient, got {}{}",
               leaf.str(), leaf.requires_grad() ? " (an op result)" : "");
  leaf.ensure_autograd_meta().post_accumulate_grad_hooks.push_back(std::move(hook));
}

void clear_hooks(const Tensor& t) {
  AutogradMeta* meta = t.autograd_meta();
  if (meta == nullptr) return;
  meta->grad_hooks.clear();
  meta->post_accumulate_grad_hooks.clear();
  if (meta->grad_fn) {
    auto& hooks = meta->grad_fn->pre_hooks;
    std::erase_if(hooks, [&](const auto& h) { return h.first == meta->output_nr; });
  }
}

void backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
  TESSEL_CHECK(root.defined() && root.requires_grad(), InvalidArgument,
               "backward() on {} which does not require a gradient (no input of the "
               "computation had set_requires_grad(true), or it ran under NoGradGuard)",
               root.str());
  Tensor seed = gradient;
  if (!seed.defined()) {
    TESSEL_CHECK(root.numel() == 1, InvalidArgument,
                 "backward() of a non-scalar tensor of shape {} needs an explicit gradient of "
                 "that shape",
                 shape_str(root.shape()));
    seed = ones_like(root);
  }
  TESSEL_CHECK(seed.shape() == root.shape(), InvalidArgument,
               "backward(): gradient shape {} does not match the root's shape {}",
               shape_str(seed.shape()), shape_str(root.shape()));
  NoGradGuard no_grad;
  // Backward functions compute in the dtypes their forward saved, whatever the caller's policy.
  AutocastGuard no_autocast(DType::kBF16, /*enabled=*/false);
  const Edge root_edge = gradient_edge(root);
  // Callbacks queued while this pass runs; restored on exit, so a backward() inside a hook
  // keeps its own queue.
  std::vector<std::function<void()>> callbacks;
  CallbackScope callback_scope(&callbacks);

  // Count, for every node reachable from the root, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::vector<Node*> stack = {root_edge.node.get()};
  keep_alive[root_edge.node.get()] = root_edge.node;
  dependencies[root_edge.node.get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      if (keep_alive.emplace(e.node.get(), e.node).second) stack.push_back(e.node.get());
      ++dependencies[e.node.get()];
    }
  }

  // Run nodes whose inputs are complete, newest first.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::priority_queue<Node*, std::vector<Node*>, ByNewest> ready;
  buffers[root_edge.node.get()].resize(root_edge.node->outputs.size());
  buffers[root_edge.node.get()][root_edge.input_nr] =
      conform(seed, *root_edge.node, root_edge.input_nr);
  ready.push(root_edge.node.get());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->outputs.size());
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> input_grads;
    if (any) {
      for (auto& [slot, hook] : node->pre_hooks) {
        if (!grads[slot].defined()) continue;
        Tensor replaced = hook(grads[slot]);
        if (replaced.defined()) grads[slot] = conform(replaced, *node, slot);
      }
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined()) {
          const Node::OutputMeta& m = node->outputs[i];
          grads[i] = zeros(m.shape, m.dtype, m.device);
        }
      }
      input_grads = node->apply(std::move(grads));
      TESSEL_CHECK(input_grads.size() == node->next_edges.size() || input_grads.empty(), Internal,
                   "{} returned {} gradients for {} inputs", node->name, input_grads.size(),
                   node->next_edges.size());
    }
    if (!retain_graph) node->release();
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.node) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        std::vector<Tensor>& buf = buffers[e.node.get()];
        buf.resize(e.node->outputs.size());
        Tensor g = conform(input_grads[i], *e.node, e.input_nr);
        buf[e.input_nr] = buf[e.input_nr].defined() ? add(buf[e.input_nr], g) : g;
      }
      if (--dependencies[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
  run_callbacks(callbacks);
}

void queue_callback(std::function<void()> callback) {
  TESSEL_CHECK(t_callbacks != nullptr, InvalidArgument,
               "queue_callback() outside backward(): callbacks can only be queued by hooks and "
               "backward functions while a backward pass runs on this thread");
  t_callbacks->push_back(std::move(callback));
}

bool in_backward() { return t_callbacks != nullptr; }

// ---- Selective recomputation ------------------------------------------------------------------

int64_t OpOutputCache::bytes() const {
  int64_t total = 0;
  for (size_t i = next_; i < entries_.size(); ++i) {
    for (const Tensor& t : entries_[i].outputs) total += t.defined() ? t.nbytes() : 0;
  }
  return total;
}

void OpOutputCache::store(std::string_view op, const std::vector<Tensor>& outputs) {
  Entry entry{std::string(op), {}};
  for (const Tensor& t : outputs) entry.outputs.push_back(detach(t));
  entries_.push_back(std::move(entry));
}

std::vector<Tensor> OpOutputCache::take(std::string_view op) {
  TESSEL_CHECK(next_ < entries_.size(), InvalidArgument,
               "recomputed forward: {} wants a kept output, but the first forward kept only {}", op,
               entries_.size());
  Entry& entry = entries_[next_];
  TESSEL_CHECK(entry.op == op, InvalidArgument,
               "recomputed forward: op {} of {} is {}, but the first forward kept {} there "
               "(the recomputation took another path)",
               next_, entries_.size(), op, entry.op);
  ++next_;
  std::vector<Tensor> outputs = std::move(entry.outputs);
  entry.outputs.clear();
  return outputs;
}

OpOutputCacheGuard::OpOutputCacheGuard(OpOutputCache* cache) : previous_(t_op_output_cache) {
  t_op_output_cache = cache;
}

OpOutputCacheGuard::~OpOutputCacheGuard() { t_op_output_cache = previous_; }

OpOutputCache* op_output_cache() { return t_op_output_cache; }

// ---- Deferred weight gradients ----------------------------------------------------------------

void DeferredWeightGrads::defer(std::vector<Tensor> leaves, Compute compute) {
  for (const Tensor& leaf : leaves) {
    TESSEL_CHECK(leaf.defined() && leaf.requires_grad() && is_leaf(leaf), Internal,
                 "deferred weight gradient for {}, which is not a leaf that requires a gradient",
                 leaf.defined() ? leaf.str() : std::string("an undefined tensor"));
  }
  entries_.push_back({std::move(leaves), std::move(compute)});
  ++deferred_total_;
}

void DeferredWeightGrads::run() {
  std::vector<Entry> entries = std::move(entries_);
  entries_.clear();
  // As backward(): no recording, the saved dtypes, and a callback queue for the hooks.
  NoGradGuard no_grad;
  AutocastGuard no_autocast(DType::kBF16, /*enabled=*/false);
  std::vector<std::function<void()>> callbacks;
  {
    CallbackScope callback_scope(&callbacks);
    for (Entry& entry : entries) {
      std::vector<Tensor> grads = entry.compute();
      entry.compute = nullptr;  // frees the saved input and output gradient
      TESSEL_CHECK(grads.size() == entry.leaves.size(), Internal,
                   "a deferred weight gradient returned {} gradients for {} leaves", grads.size(),
                   entry.leaves.size());
      for (size_t i = 0; i < grads.size(); ++i) {
        if (!grads[i].defined()) continue;
        const std::shared_ptr<Node> sink = grad_accumulator(entry.leaves[i]);
        std::vector<Tensor> in;
        in.push_back(conform(grads[i], *sink, 0));
        grads[i] = Tensor();  // so the sink may take the gradient as it is, as backward() does
        sink->apply(std::move(in));
      }
    }
    run_callbacks(callbacks);
  }
}

namespace {
thread_local DeferredWeightGrads* t_deferred_weight_grads = nullptr;
}  // namespace

DeferWeightGradsGuard::DeferWeightGradsGuard(DeferredWeightGrads* store)
    : previous_(t_deferred_weight_grads) {
  t_deferred_weight_grads = store;
}

DeferWeightGradsGuard::~DeferWeightGradsGuard() { t_deferred_weight_grads = previous_; }

DeferredWeightGrads* deferred_weight_grads() { return t_deferred_weight_grads; }

// ---- Custom functions -------------------------------------------------------------------------

struct FunctionContextAccess {
  static void init(FunctionContext& ctx, const std::vector<Tensor>& inputs) {
    for (const Tensor& t : inputs)
      ctx.needs_input_grad_.push_back(t.defined() && t.requires_grad());
  }
  static void release(FunctionContext& ctx) {
    ctx.saved_.clear();
    ctx.data.reset();
    ctx.released_ = true;
  }
};

void FunctionContext::save_for_backward(const std::vector<Tensor>& tensors) {
  saved_.clear();
  for (const Tensor& t : tensors) saved_.push_back(detach(t));
}

const std::vector<Tensor>& FunctionContext::saved_tensors() const {
  TESSEL_CHECK(!released_, InvalidArgument,
               "saved tensors were freed by a previous backward(); pass retain_graph=true to "
               "back-propagate twice");
  return saved_;
}

bool FunctionContext::needs_input_grad(size_t i) const {
  return i < needs_input_grad_.size() && needs_input_grad_[i];
}

std::vector<Tensor> apply_function(std::string_view name, const std::vector<Tensor>& inputs,
                                   const FunctionForward& forward, FunctionBackward backward) {
  auto ctx = std::make_shared<FunctionContext>();
  FunctionContextAccess::init(*ctx, inputs);
  const bool record = needs_grad(inputs);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = forward(*ctx, inputs);
  }
  if (!record) return outputs;
  for (Tensor& out : outputs) {
    for (const Tensor& in : inputs) {
      if (out.impl_ptr() == in.impl_ptr()) out = detach(out);  // an alias gets its own handle
    }
  }
  auto node = std::make_shared<FunctionNode>(
      std::string(name),
      [ctx, backward = std::move(backward)](const std::vector<Tensor>& grads) {
        std::vector<Tensor> result = backward(*ctx, grads);
        TESSEL_CHECK(result.size() == ctx->num_inputs(), InvalidArgument,
                     "custom op backward returned {} gradients for {} inputs", result.size(),
                     ctx->num_inputs());
        return result;
      },
      [ctx] { FunctionContextAccess::release(*ctx); });
  record_node(node, inputs, outputs);
  return outputs;
}

}  // namespace tessel
