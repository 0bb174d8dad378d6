// fully_shard: per-group state, flat all_gather / reduce_scatter, prefetching, the end-of-
// backward reduction. See fsdp.h for the semantics.
#include "tessel/parallel/fsdp/fsdp.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/collectives/compute_span.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"
#include "tessel/parallel/internal/host_collectives.h"
#include "tessel/parallel/internal/mesh_util.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

constexpr char kAttachment[] = "tessel.fsdp";

class Group;

// The groups under one root and what one training iteration has done so far.
struct Context {
  Group* root = nullptr;
  std::vector<Group*> groups;  // every group under the root, root first (tree order)
  std::vector<Group*> order;   // forward order, recorded during the first forward
  bool recording = true;
  bool backward_queued = false;
  Group* reducing = nullptr;  // the group whose reduce_scatter was issued last (maybe pending)
};

// How the rows (dim 0) of every parameter of a group are split over a group of ranks.
struct Layout {
  std::shared_ptr<ProcessGroup> group;
  int index = 0;                              // this rank's index in `group`
  std::vector<std::vector<int64_t>> rows;     // [param][rank]
  std::vector<std::vector<int64_t>> row_off;  // [param][rank]
  std::vector<int64_t> counts;                // elements each rank holds in all
};

struct Param {
  std::string name;        // dotted, relative to the group's module
  Tensor* slot = nullptr;  // the owning module's parameter slot
  Tensor sharded;          // f32 (the parameter's dtype) local shard: what the slot holds at rest
  Tensor unsharded;        // param_dtype, the whole shape; storage released when resharded
  Tensor small;            // this rank's piece of the N-way layout (reshard_after_forward = N)
  Shape full_shape;
  int64_t row_numel = 1;  // elements per dim-0 row
  bool requires_grad = false;
};

// The elements of parameter p held by rank r under `layout`.
int64_t piece_numel(const Layout& layout, const std::vector<Param>& params, size_t p, size_t r) {
  return layout.rows[p][r] * params[p].row_numel;
}

class Group final : public FSDPModule {
 public:
  Group(nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options)
      : module_(module), mesh_(mesh), options_(std::move(options)) {
    resolve_dims();
    collect_params();
    register_hooks();
  }

  nn::Module& module() override { return module_; }
  FSDPStats stats() const override { return stats_; }
  void set_requires_gradient_sync(bool on) override {
    for_each_group_below([on](Group& g) { g.sync_ = on; });
  }
  void set_requires_all_reduce(bool on) override {
    for_each_group_below([on](Group& g) { g.all_reduce_ = on; });
  }
  void set_reshard_after_backward(bool on) override {
    for_each_group_below([on](Group& g) { g.reshard_after_backward_ = on; });
  }
  void set_modules_to_forward_prefetch(std::vector<FSDPModule*> modules) override {
    forward_prefetch_ = std::move(modules);
  }
  void set_modules_to_backward_prefetch(std::vector<FSDPModule*> modules) override {
    backward_prefetch_ = std::move(modules);
  }

  void unshard(bool async) override {
    if (state_ == State::kSharded) issue_all_gather(small_kept_ ? small_layout() : shard_layout());
    if (!async && state_ == State::kGathering) finish_all_gather();
  }

  void reshard() override {
    if (state_ == State::kGathering) finish_all_gather();
    if (state_ == State::kSharded) return;
    for (Param& p : params_) {
      *p.slot = p.sharded;
      if (p.unsharded.defined()) p.unsharded.storage().release();
      p.small = Tensor();
    }
    small_kept_ = false;
    state_ = State::kSharded;
  }

  const std::vector<Param>& params() const { return params_; }
  Context* context() const { return context_.get(); }

 private:
  enum class State { kSharded, kGathering, kUnsharded };

  // --- Set-up --------------------------------------------------------------------------------

  void resolve_dims() {
    const auto names = mesh_.dim_names();
    TESSEL_CHECK(mesh_.ndim() <= 2, InvalidArgument,
                 "fully_shard needs a 1-D mesh (shard) or a 2-D one (replicate, shard), got {}",
                 mesh_.str());
    shard_dim_ = options_.shard_dim.empty() ? names.back() : options_.shard_dim;
    TESSEL_CHECK(mesh_.layout().has_dim(shard_dim_), InvalidArgument,
                 "fully_shard: mesh {} has no dimension '{}' to shard over", mesh_.shape_str(),
                 shard_dim_);
    replicate_dim_ = options_.replicate_dim;
    if (replicate_dim_.empty() && mesh_.ndim() == 2) {
      replicate_dim_ = names[0] == shard_dim_ ? names[1] : names[0];
    }
    if (!replicate_dim_.empty()) {
      TESSEL_CHECK(mesh_.layout().has_dim(replicate_dim_) && replicate_dim_ != shard_dim_,
                   InvalidArgument,
                   "fully_shard: mesh {} has no dimension '{}' to replicate over (other than "
                   "the shard dimension '{}')",
                   mesh_.shape_str(), replicate_dim_, shard_dim_);
    }
    const int64_t shards = mesh_.size(shard_dim_);
    if (const int64_t* n = std::get_if<int64_t>(&options_.reshard_after_forward)) {
      TESSEL_CHECK(*n >= 1 && shards % *n == 0, InvalidArgument,
                   "fully_shard: reshard_after_forward = {} does not divide the {} ranks of "
                   "mesh dimension '{}'",
                   *n, shards, shard_dim_);
      small_size_ = *n == shards ? 0 : *n;
      reshard_after_forward_ = *n != 1;
    } else {
      reshard_after_forward_ = std::get<bool>(options_.reshard_after_forward);
    }
  }

  // The parameters of module_ not managed by a fully_shard'ed descendant.
  void collect_params() {
    std::vector<std::string> managed;  // prefixes of fully_shard'ed descendants
    for (auto& [prefix, m] : module_.named_modules()) {
      if (!prefix.empty() && m->attachment(kAttachment)) managed.push_back(prefix + ".");
    }
    const std::vector<int64_t> coord = mesh_.coordinate();
    const int64_t shards = mesh_.size(shard_dim_);
    const int64_t me = mesh_.local_rank(shard_dim_);
    for (auto& [name, tensor] : module_.named_parameters()) {
      const bool below = std::any_of(managed.begin(), managed.end(),
                                     [&](const std::string& m) { return name.rfind(m, 0) == 0; });
      if (below) continue;
      TESSEL_CHECK(tensor.dim() >= 1, InvalidArgument,
                   "fully_shard: parameter '{}' is a scalar; FSDP shards dim 0", name);
      Param p;
      p.name = name;
      p.slot = &module_.parameter(name);
      p.full_shape = tensor.shape();
      p.row_numel = tensor.numel() / std::max<int64_t>(tensor.size(0), 1);
      if (tensor.size(0) == 0)
        p.row_numel = shape_numel(Shape(tensor.shape().begin() + 1, tensor.shape().end()));
      p.requires_grad = tensor.requires_grad();
      // This rank's rows, a copy with the shard's metadata (a DTensor spec on the mesh).
      const auto [row0, rows] = chunk_of(tensor.size(0), shards, me);
      Shape shard_shape = p.full_shape;
      shard_shape[0] = rows;
      {
        NoGradGuard no_grad;
        p.sharded = tensor.is_meta() ? empty(shard_shape, tensor.dtype(), Device::meta())
                                     : contiguous(clone(narrow(detach(tensor), 0, row0, rows)));
      }
      const auto spec = shard_spec(name, tensor);
      const Shape offset = spec->region(spec->mesh().coordinate()).first;
      p.sharded.set_shard_info(
          std::make_shared<ShardInfo>(ShardInfo{spec->global_shape(), offset, spec}));
      if (p.requires_grad) p.sharded.set_requires_grad(true);
      *p.slot = p.sharded;
      params_.push_back(std::move(p));
    }
    (void)coord;
  }

  // The DTensor spec of a parameter's shard: Shard(0) over the shard dimension. A parameter
  // that tensor parallelism split already (a spec on the tp mesh) is split again — FSDP shards
  // its local tensor on dim 0 — so its spec joins both meshes, (dp..., tp...), tp splitting
  // first: for a column-parallel weight (Shard(0), Shard(0)) with shard order {tp, dp}.
  std::shared_ptr<const DTensorSpec> shard_spec(const std::string& name, const Tensor& t) const {
    std::vector<Placement> placements;
    for (const std::string& dim : mesh_.dim_names()) {
      placements.push_back(dim == shard_dim_ ? Placement(Shard{0}) : Placement(Replicate{}));
    }
    const ShardInfo* split = t.shard_info();
    if (split == nullptr) {
      return std::make_shared<const DTensorSpec>(mesh_, placements, t.shape(), t.dtype());
    }
    TESSEL_CHECK(split->spec != nullptr, InvalidArgument,
                 "fully_shard: parameter '{}' is a piece of a larger tensor without a DTensor "
                 "spec ({})",
                 name, t.str());
    const auto& inner = *std::static_pointer_cast<const DTensorSpec>(split->spec);
    std::optional<DeviceMesh> joined;
    try {
      joined = mesh_.join(inner.mesh());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format(
          "fully_shard: parameter '{}' is split over mesh {}, which does not combine with the "
          "FSDP mesh {}: {}",
          name, inner.mesh().shape_str(), mesh_.shape_str(), e.message()));
    }
    placements.insert(placements.end(), inner.placements().begin(), inner.placements().end());
    std::vector<int64_t> order;
    for (int64_t d : inner.shard_order()) order.push_back(mesh_.ndim() + d);
    for (int64_t d = 0; d < mesh_.ndim(); ++d) order.push_back(d);
    return std::make_shared<const DTensorSpec>(*joined, placements, inner.global_shape(), t.dtype(),
                                               order);
  }

  void register_hooks() {
    module_.register_forward_pre_hook(
        [this](nn::Module&, nn::Tensors& inputs) { pre_forward(inputs); });
    module_.register_forward_hook(
        [this](nn::Module&, const nn::Tensors&, nn::Tensors& outputs) { post_forward(outputs); });
    module_.register_backward_pre_hook([this](nn::Module&, nn::Tensors&) { pre_backward(); });
  }

  // The groups of module_'s subtree (this one included), for recursive settings.
  void for_each_group_below(const std::function<void(Group&)>& fn) {
    for (auto& [prefix, m] : module_.named_modules()) {
      if (auto a = m->attachment(kAttachment)) fn(*static_cast<Group*>(a.get()));
    }
  }

  // --- Layouts -------------------------------------------------------------------------------

  Layout make_layout(std::shared_ptr<ProcessGroup> group, int64_t parts, int64_t index,
                     const std::function<std::pair<int64_t, int64_t>(size_t, int64_t)>& span) {
    Layout l;
    l.group = std::move(group);
    l.index = static_cast<int>(index);
    l.counts.assign(static_cast<size_t>(parts), 0);
    for (size_t p = 0; p < params_.size(); ++p) {
      l.rows.emplace_back(parts);
      l.row_off.emplace_back(parts);
      for (int64_t r = 0; r < parts; ++r) {
        const auto [off, n] = span(p, r);
        l.row_off[p][r] = off;
        l.rows[p][r] = n;
        l.counts[r] += n * params_[p].row_numel;
      }
    }
    return l;
  }

  const Layout& shard_layout() {
    if (!shard_layout_) {
      const int64_t parts = mesh_.size(shard_dim_);
      shard_layout_ = std::make_unique<Layout>(make_layout(
          mesh_.group(shard_dim_), parts, mesh_.local_rank(shard_dim_),
          [&](size_t p, int64_t r) { return chunk_of(params_[p].full_shape[0], parts, r); }));
    }
    return *shard_layout_;
  }

  // reshard_after_forward = N: the shard dimension split into (outer, N); each group of N ranks
  // holds the whole parameters split N ways.
  const Layout& small_layout() {
    if (!small_layout_) {
      const int64_t parts = small_size_;
      const DeviceMesh split = mesh_[shard_dim_].unflatten(
          shard_dim_, {mesh_.size(shard_dim_) / parts, parts}, {"__fsdp_outer", "__fsdp_inner"});
      small_layout_ = std::make_unique<Layout>(make_layout(
          split.group("__fsdp_inner"), parts, split.local_rank("__fsdp_inner"),
          [&](size_t p, int64_t r) { return chunk_of(params_[p].full_shape[0], parts, r); }));
    }
    return *small_layout_;
  }

  // --- Unshard ---------------------------------------------------------------------------------

  DType param_dtype(const Param& p) const {
    return options_.mp_policy.param_dtype.value_or(p.sharded.dtype());
  }

  // Packs this rank's pieces under `layout` (cast to param_dtype) and issues one flat
  // all_gather of every parameter's rows.
  void issue_all_gather(const Layout& layout) {
    const bool from_small = &layout == small_layout_.get();
    const DType dtype = params_.empty() ? DType::kF32 : param_dtype(params_[0]);
    const Device device = params_.empty() ? Device::cpu() : params_[0].sharded.device();
    NoGradGuard no_grad;
    Tensor input = empty({layout.counts[layout.index]}, dtype, device);
    int64_t at = 0;
    for (size_t p = 0; p < params_.size(); ++p) {
      const Tensor& piece = from_small ? params_[p].small : params_[p].sharded;
      const int64_t n = piece_numel(layout, params_, p, layout.index);
      if (n > 0) copy_(view(narrow(input, 0, at, n), piece.shape()), piece);
      at += n;
    }
    int64_t total = 0;
    for (int64_t c : layout.counts) total += c;
    gather_out_ = empty({total}, dtype, device);
    gather_layout_ = &layout;
    gather_work_ =
        layout.group->all_gather(input, gather_out_, {.counts = layout.counts, .async = true});
    ++stats_.all_gathers;
    state_ = State::kGathering;
  }

  // Waits for the all_gather and copies each parameter's rows into its unsharded tensor.
  void finish_all_gather() {
    wait_timed(gather_work_);
    const Layout& layout = *gather_layout_;
    NoGradGuard no_grad;
    std::vector<int64_t> rank_start(layout.counts.size(), 0);
    for (size_t r = 1; r < rank_start.size(); ++r) {
      rank_start[r] = rank_start[r - 1] + layout.counts[r - 1];
    }
    std::vector<int64_t> within(layout.counts.size(), 0);  // per rank: elements copied so far
    for (size_t p = 0; p < params_.size(); ++p) {
      Param& prm = params_[p];
      ensure_unsharded(prm);
      for (size_t r = 0; r < layout.counts.size(); ++r) {
        const int64_t n = piece_numel(layout, params_, p, r);
        if (n > 0) {
          Tensor dst = narrow(prm.unsharded, 0, layout.row_off[p][r], layout.rows[p][r]);
          copy_(dst, view(narrow(gather_out_, 0, rank_start[r] + within[r], n), dst.shape()));
        }
        within[r] += n;
      }
      *prm.slot = prm.unsharded;
    }
    gather_out_ = Tensor();
    gather_work_ = Work();
    state_ = State::kUnsharded;
  }

  // The parameter's unsharded tensor with memory: made once (a leaf that collects the
  // parameter's gradient), then refilled in place after each reshard.
  void ensure_unsharded(Param& p) {
    if (!p.unsharded.defined()) {
      p.unsharded = empty(p.full_shape, param_dtype(p), p.sharded.device());
      if (p.requires_grad) {
        p.unsharded.set_requires_grad(true);
        register_post_accumulate_grad_hook(p.unsharded, [this](const Tensor&) { on_grad_ready(); });
      }
    } else {
      p.unsharded.storage().refill();
    }
  }

  // The flight recorder's compute spans: "fsdp forward <module path>" from after the group's
  // pre-forward to its post-forward, "fsdp backward <module path>" from after its pre-backward
  // until its gradients are complete (or the end of backward); the root's usually enclose the
  // others'.
  void name_spans(const std::string& path) {
    const std::string name = path.empty() ? "(root)" : path;
    forward_span_name_ = "fsdp forward " + name;
    backward_span_name_ = "fsdp backward " + name;
  }

  Device compute_device() const {
    return params_.empty() ? Device::cpu() : params_[0].sharded.device();
  }

  void wait_timed(Work& work) {
    const Stopwatch watch;
    work.wait();
    stats_.exposed_wait_s += watch.elapsed_seconds();
  }

  // --- Hooks -----------------------------------------------------------------------------------

  void lazy_init() {
    if (context_) return;
    // The first group whose forward runs outside any other's is the root of its subtree.
    auto ctx = std::make_shared<Context>();
    ctx->root = this;
    for (auto& [prefix, m] : module_.named_modules()) {
      if (auto a = m->attachment(kAttachment)) {
        Group* g = static_cast<Group*>(a.get());
        TESSEL_CHECK(g->context_ == nullptr || g == this, InvalidArgument,
                     "fully_shard: module '{}' already ran under another root", prefix);
        g->context_ = ctx;
        g->name_spans(prefix);
        ctx->groups.push_back(g);
      }
    }
    is_root_ = true;
    reshard_after_forward_ = false;  // backward needs the root's parameters at once
    validate_across_ranks(*ctx);
  }

  void pre_forward(nn::Tensors& inputs) {
    lazy_init();
    Context& ctx = *context_;
    if (ctx.recording && std::find(ctx.order.begin(), ctx.order.end(), this) == ctx.order.end()) {
      ctx.order.push_back(this);
    }
    // The next group's all_gather queues behind this group's before this thread blocks on it,
    // so the link never idles while this thread wakes up.
    unshard(true);
    prefetch(forward_prefetch_, +1);
    unshard(false);
    if (options_.mp_policy.param_dtype) {  // compute in param_dtype (the casts are recorded)
      for (Tensor& x : inputs) {
        if (x.defined() && is_floating(x.dtype())) x = to(x, *options_.mp_policy.param_dtype);
      }
    }
    forward_span_ = ComputeSpan(forward_span_name_, compute_device());
  }

  void post_forward(nn::Tensors& outputs) {
    forward_span_.end();
    Context& ctx = *context_;
    if (is_root_) {
      ctx.recording = false;
      if (options_.mp_policy.output_dtype) {
        for (Tensor& y : outputs) {
          if (y.defined() && is_floating(y.dtype())) y = to(y, *options_.mp_policy.output_dtype);
        }
      }
    }
    if (!reshard_after_forward_ || runs_last_in_forward(ctx)) return;
    if (small_size_ > 0) {
      keep_small_shard();
    } else {
      reshard();
    }
  }

  // In a forward that autograd records, the group whose forward runs last (once the first step
  // recorded the order) keeps its parameters: its backward comes next, so freeing them would
  // only gather them again at once (torchtitan sets this by hand for the last block). Memory is
  // as in backward anyway: this group computing and the next one prefetched. The end of
  // backward reshards it as every group.
  bool runs_last_in_forward(const Context& ctx) const {
    return grad_enabled() && !ctx.recording && !ctx.order.empty() && ctx.order.back() == this;
  }

  // reshard_after_forward = N: keep this rank's piece of the N-way layout, free the rest.
  void keep_small_shard() {
    const Layout& layout = small_layout();
    NoGradGuard no_grad;
    for (size_t p = 0; p < params_.size(); ++p) {
      Param& prm = params_[p];
      prm.small = clone(
          narrow(prm.unsharded, 0, layout.row_off[p][layout.index], layout.rows[p][layout.index]));
      *prm.slot = prm.sharded;
      prm.unsharded.storage().release();
    }
    small_kept_ = true;
    state_ = State::kSharded;
  }

  void pre_backward() {
    Context& ctx = *context_;
    if (!ctx.backward_queued) {
      ctx.backward_queued = true;
      Context* c = &ctx;
      queue_callback([c] { finish_backward(*c); });
    }
    unshard(true);
    prefetch(backward_prefetch_, -1);
    unshard(false);
    if (!backward_span_.active()) {
      backward_span_ = ComputeSpan(backward_span_name_, compute_device());
    }
  }

  // Issues the all_gathers of the explicit list, or of the group next in the recorded forward
  // order (direction +1) or before it (-1).
  void prefetch(const std::vector<FSDPModule*>& explicit_list, int direction) {
    if (!explicit_list.empty()) {
      for (FSDPModule* m : explicit_list) {
        auto* g = static_cast<Group*>(m);
        if (g->state_ == State::kSharded) {
          g->unshard(true);
          ++g->stats_.prefetched;
        }
      }
      return;
    }
    const Context& ctx = *context_;
    if (ctx.recording) return;
    const auto it = std::find(ctx.order.begin(), ctx.order.end(), this);
    if (it == ctx.order.end()) return;
    long pos = it - ctx.order.begin() + direction;
    // The root's backward runs first (at the loss) and is followed by the last group's.
    if (direction < 0 && is_root_) pos = static_cast<long>(ctx.order.size()) - 1;
    if (pos < 0 || pos >= static_cast<long>(ctx.order.size())) return;
    Group* next = ctx.order[static_cast<size_t>(pos)];
    if (next == this) return;
    if (next->state_ == State::kSharded) {
      next->unshard(true);
      ++next->stats_.prefetched;
    }
  }

  // --- Gradients -------------------------------------------------------------------------------

  DType reduce_dtype(const Param& p) const {
    return options_.mp_policy.reduce_dtype.value_or(param_dtype(p));
  }

  // A parameter's complete gradient of this backward pass is in its unsharded tensor.
  void on_grad_ready() {
    ++grads_ready_;
    int64_t wanted = 0;
    for (const Param& p : params_) wanted += p.requires_grad;
    if (grads_ready_ != wanted) return;
    backward_span_.end();  // the group's gradients are complete: so is its backward compute
    if (sync_) issue_reduce_scatter();
  }

  // Packs every gradient rank-major (rank r's rows of each parameter, cast to reduce_dtype) and
  // issues one flat reduce_scatter (average over the shard dimension); frees the unsharded
  // gradients and, the gradients being out, the unsharded parameters.
  void issue_reduce_scatter() {
    const Layout& layout = shard_layout();
    std::vector<size_t> with_grad;
    for (size_t p = 0; p < params_.size(); ++p) {
      if (params_[p].requires_grad && params_[p].unsharded.defined() &&
          params_[p].unsharded.grad().defined()) {
        with_grad.push_back(p);
      }
    }
    if (with_grad.empty() || pending_reduce_) return;
    // One reduce_scatter in flight at a time (FSDP2's rule): the previous group's has had this
    // group's backward to finish in, and waiting for it here bounds the packed gradient buffers
    // alive to two, whatever the communication's speed.
    if (context_ && context_->reducing != nullptr && context_->reducing != this &&
        context_->reducing->pending_reduce_) {
      context_->reducing->finish_reduce();
    }
    const DType dtype = reduce_dtype(params_[with_grad[0]]);
    const Device device = params_[with_grad[0]].sharded.device();
    NoGradGuard no_grad;
    std::vector<int64_t> counts(layout.counts.size(), 0);
    for (size_t r = 0; r < counts.size(); ++r) {
      for (size_t p : with_grad) counts[r] += piece_numel(layout, params_, p, r);
    }
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    // Parameter by parameter (each rank's rows to that rank's segment), freeing each gradient
    // once packed, so the gradients and the packed buffer are never both whole.
    Tensor input = empty({total}, dtype, device);
    std::vector<int64_t> at(counts.size(), 0);
    for (size_t r = 1; r < counts.size(); ++r) at[r] = at[r - 1] + counts[r - 1];
    for (size_t p : with_grad) {
      const Tensor grad = params_[p].unsharded.grad();
      params_[p].unsharded.set_grad(Tensor());
      for (size_t r = 0; r < counts.size(); ++r) {
        const int64_t n = piece_numel(layout, params_, p, r);
        if (n > 0) {
          const Tensor src = narrow(grad, 0, layout.row_off[p][r], layout.rows[p][r]);
          copy_(view(narrow(input, 0, at[r], n), src.shape()), src);
        }
        at[r] += n;
      }
    }
    reduce_out_ = empty({counts[layout.index]}, dtype, device);
    reduce_params_ = with_grad;
    reduce_work_ = layout.group->reduce_scatter(
        input, reduce_out_, {.op = ReduceOp::kAvg, .counts = counts, .async = true});
    ++stats_.reduce_scatters;
    pending_reduce_ = true;
    if (context_) context_->reducing = this;
    reshard();
  }

  // Waits for the reduce_scatter, all_reduces across replicas (HSDP) and adds the result to the
  // sharded gradients.
  void finish_reduce() {
    wait_timed(reduce_work_);
    const Layout& layout = shard_layout();
    NoGradGuard no_grad;
    Tensor out = reduce_out_;
    std::vector<Tensor> views;
    int64_t at = 0;
    for (size_t p : reduce_params_) {
      const Param& prm = params_[p];
      const int64_t n = piece_numel(layout, params_, p, layout.index);
      views.push_back(view(narrow(out, 0, at, n), prm.sharded.shape()));
      at += n;
    }
    bool fresh = true;  // no accumulated gradient: the views can be the gradients
    for (size_t p : reduce_params_) fresh = fresh && !params_[p].sharded.grad().defined();
    const bool hsdp = !replicate_dim_.empty() && mesh_.size(replicate_dim_) > 1;
    for (size_t k = 0; k < reduce_params_.size(); ++k) {
      Param& prm = params_[reduce_params_[k]];
      const Tensor g =
          views[k].dtype() == prm.sharded.dtype() ? views[k] : to(views[k], prm.sharded.dtype());
      if (prm.sharded.grad().defined()) {
        add_(prm.sharded.grad(), g);
      } else {
        prm.sharded.set_grad(g.dtype() == out.dtype() && fresh ? g : clone(g));
      }
    }
    if (hsdp && all_reduce_) {
      auto replicas = mesh_.group(replicate_dim_);
      if (fresh && out.dtype() == params_[reduce_params_[0]].sharded.dtype()) {
        replicas->all_reduce(out, {.op = ReduceOp::kAvg});  // the gradients view it
      } else {
        for (size_t p : reduce_params_) {
          Tensor g = params_[p].sharded.grad();
          replicas->all_reduce(g, {.op = ReduceOp::kAvg});
        }
      }
      ++stats_.all_reduces;
    }
    reduce_out_ = Tensor();
    reduce_work_ = Work();
    reduce_params_.clear();
    pending_reduce_ = false;
  }

  // End of the whole backward pass (queued by the first pre-backward): reduce what is still
  // unreduced (parameters some step did not use), wait for every reduction, free everything.
  static void finish_backward(Context& ctx) {
    for (Group* g : ctx.groups) {
      g->backward_span_.end();  // a group some of whose gradients never came
      if (g->sync_ && !g->pending_reduce_) g->issue_reduce_scatter();
    }
    for (Group* g : ctx.groups) {
      if (g->pending_reduce_) g->finish_reduce();
      if (g->reshard_after_backward_) g->reshard();
      g->grads_ready_ = 0;
    }
    ctx.reducing = nullptr;
    ctx.backward_queued = false;
  }

  // --- Validation ----------------------------------------------------------------------------

  // Every rank must shard the same parameters: one all_gather of a fingerprint; on a mismatch,
  // two more find and name the first parameter that differs (the same message everywhere).
  void validate_across_ranks(const Context& ctx) {
    std::vector<std::string> entries;
    for (const Group* g : ctx.groups) {
      for (const Param& p : g->params_) {
        // The whole parameter's shape: tensor-parallel pieces may differ across ranks.
        entries.push_back(
            fmt::format("{}:{} {}", g->module_.type_name(), p.name,
                        typed_shape_str(p.sharded.dtype(), p.sharded.shard_info()->global_shape)));
      }
    }
    auto group = internal::whole_mesh_group(mesh_);
    auto hash_of = [](const std::string& s) {
      return static_cast<int64_t>(std::hash<std::string>{}(s)&0x7fffffffffffffffULL);
    };
    int64_t all = static_cast<int64_t>(entries.size());
    for (const std::string& e : entries) all = all * 1000003 + hash_of(e);
    // Through the group's device (NCCL moves device memory only); prefilled with this rank's
    // own fingerprint, so a transport that moves no data (the fake backend) finds agreement.
    const std::vector<int64_t> e =
        internal::all_gather_values(*group, {static_cast<int64_t>(entries.size()), all});
    bool same = true;
    int64_t most = 0;
    for (int r = 0; r < group->size(); ++r) {
      same = same && e[2 * r] == e[0] && e[2 * r + 1] == e[1];
      most = std::max(most, e[2 * r]);
    }
    if (same) return;
    // Which entry differs first: per-entry hashes, padded to the longest list.
    std::vector<int64_t> hashes(static_cast<size_t>(most), -1);
    for (size_t i = 0; i < entries.size(); ++i) hashes[i] = hash_of(entries[i]);
    const std::vector<int64_t> h = internal::all_gather_values(*group, hashes);
    int64_t first = most;
    int differing = 0;
    for (int64_t i = 0; i < most && first == most; ++i) {
      for (int r = 1; r < group->size(); ++r) {
        if (h[r * most + i] != h[i]) {
          first = i;
          differing = r;
          break;
        }
      }
    }
    // Both ranks' texts of that entry.
    constexpr int64_t kText = 256;
    std::vector<int64_t> text(kText, 0);
    const std::string mine_text =
        first < static_cast<int64_t>(entries.size()) ? entries[first] : "(nothing)";
    for (size_t i = 0; i < mine_text.size() && i < kText; ++i) text[i] = mine_text[i];
    const std::vector<int64_t> texts = internal::all_gather_values(*group, text);
    auto text_of = [&](int r) {
      std::string s;
      for (int64_t i = 0; i < kText && texts[r * kText + i] != 0; ++i) {
        s += static_cast<char>(texts[r * kText + i]);
      }
      return s;
    };
    throw InvalidArgument(fmt::format(
        "fully_shard: ranks disagree on the model: sharded parameter #{} is '{}' on rank 0 but "
        "'{}' on rank {} (every rank must build the same model and shard it the same way)",
        first, text_of(0), text_of(differing), differing));
  }

  nn::Module& module_;
  DeviceMesh mesh_;
  FullyShardOptions options_;
  std::string shard_dim_, replicate_dim_;
  bool reshard_after_forward_ = true;
  int64_t small_size_ = 0;  // > 0: keep an N-way shard after forward
  bool small_kept_ = false;
  std::vector<Param> params_;
  std::unique_ptr<Layout> shard_layout_, small_layout_;
  std::shared_ptr<Context> context_;
  bool is_root_ = false;
  State state_ = State::kSharded;
  const Layout* gather_layout_ = nullptr;
  Tensor gather_out_;
  Work gather_work_;
  bool sync_ = true;
  bool all_reduce_ = true;
  bool reshard_after_backward_ = true;
  int64_t grads_ready_ = 0;
  bool pending_reduce_ = false;
  Tensor reduce_out_;
  Work reduce_work_;
  std::vector<size_t> reduce_params_;
  std::vector<FSDPModule*> forward_prefetch_, backward_prefetch_;
  FSDPStats stats_;
  std::string forward_span_name_, backward_span_name_;
  ComputeSpan forward_span_, backward_span_;
};

}  // namespace

FSDPModule& fully_shard(nn::Module& module, const DeviceMesh& mesh,
                        const FullyShardOptions& options) {
  TESSEL_CHECK(module.attachment(kAttachment) == nullptr, InvalidArgument,
               "fully_shard: this {} was already fully_shard'ed", module.type_name());
  auto group = std::make_shared<Group>(module, mesh, options);
  module.set_attachment(kAttachment, group);
  return *group;
}

FSDPModule* fsdp_module(nn::Module& module) {
  return static_cast<Group*>(module.attachment(kAttachment).get());
}

}  // namespace tessel
