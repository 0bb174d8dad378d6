#include "tessel/parallel/fsdp/ddp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/collectives/compute_span.h"
#include "tessel/parallel/internal/host_collectives.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

// "f32[96, 32]"
std::string describe_tensor(const Tensor& t) {
  return fmt::format("{}[{}]", dtype_name(t.dtype()), fmt::join(t.shape(), ", "));
}

// One line per parameter and buffer, in the order every rank must agree on.
std::vector<std::string> describe_model(const nn::Module& module) {
  std::vector<std::string> lines;
  for (const auto& [name, p] : module.named_parameters()) {
    lines.push_back(fmt::format("parameter '{}' {}{}", name, describe_tensor(p),
                                p.requires_grad() ? "" : " (frozen)"));
  }
  for (const auto& [name, b] : module.named_buffers()) {
    lines.push_back(fmt::format("buffer '{}' {}", name, describe_tensor(b)));
  }
  return lines;
}

// FNV-1a, kept to 62 bits so that it and its negation fit an int64.
int64_t hash_lines(const std::vector<std::string>& lines) {
  uint64_t h = 1469598103934665603ULL;
  for (const std::string& line : lines) {
    for (char c : line) {
      h ^= static_cast<uint8_t>(c);
      h *= 1099511628211ULL;
    }
    h ^= '\n';
    h *= 1099511628211ULL;
  }
  return static_cast<int64_t>(h >> 2);
}

// Every rank's text, gathered: lengths first, then the bytes packed into int64 words.
std::vector<std::string> gather_text(ProcessGroup& group, const std::string& mine,
                                     Nanoseconds timeout) {
  const int n = group.size();
  const std::vector<int64_t> len =
      internal::all_gather_values(group, {static_cast<int64_t>(mine.size())}, timeout);
  const int64_t words = (*std::max_element(len.begin(), len.end()) + 7) / 8;
  std::vector<int64_t> packed(static_cast<size_t>(words), 0);
  std::memcpy(packed.data(), mine.data(), mine.size());
  const std::vector<int64_t> all = internal::all_gather_values(group, packed, timeout);
  const auto* bytes = reinterpret_cast<const char*>(all.data());
  std::vector<std::string> texts;
  for (int r = 0; r < n; ++r) texts.emplace_back(bytes + r * words * 8, len[r]);
  return texts;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// Throws, identically on every rank, when the ranks of `group` describe different models.
void check_same_model(ProcessGroup& group, const nn::Module& module, Nanoseconds timeout) {
  const std::vector<std::string> lines = describe_model(module);
  const int64_t h = hash_lines(lines);
  // max(h) == -max(-h) exactly when every rank has the same hash.
  const std::vector<int64_t> e =
      internal::all_reduce_values(group, {h, -h}, ReduceOp::kMax, timeout);
  if (e[0] == -e[1]) return;

  std::string mine;
  for (const std::string& line : lines) mine += line + "\n";
  const std::vector<std::string> texts = gather_text(group, mine, timeout);
  const std::vector<std::string> first = split_lines(texts[0]);
  auto rank_name = [&group](int r) {
    const int world = group.global_ranks()[static_cast<size_t>(r)];
    return world == r ? fmt::format("rank {}", r)
                      : fmt::format("rank {} (world rank {})", r, world);
  };
  for (int r = 1; r < group.size(); ++r) {
    const std::vector<std::string> other = split_lines(texts[static_cast<size_t>(r)]);
    if (other == first) continue;
    const size_t common = std::min(first.size(), other.size());
    size_t i = 0;
    while (i < common && first[i] == other[i]) ++i;
    std::string difference;
    if (i < common) {
      difference = fmt::format("entry {} is {} on {} but {} on {}", i, first[i], rank_name(0),
                               other[i], rank_name(r));
    } else if (i < first.size()) {
      difference = fmt::format("entry {} is {} on {} but is missing on {} ({} entries against {})",
                               i, first[i], rank_name(0), rank_name(r), other.size(), first.size());
    } else {
      difference = fmt::format("{} has an extra entry {}: {} ({} entries against {} on {})",
                               rank_name(r), i, other[i], other.size(), first.size(), rank_name(0));
    }
    throw InvalidArgument(fmt::format(
        "replicate over group '{}' ({} ranks): the ranks hold different models: {}; every rank "
        "must hold the same parameters and buffers (names, shapes, dtypes) in the same order",
        group.name(), group.size(), difference));
  }
  throw Internal(
      fmt::format("replicate over group '{}': the model hashes differ but every "
                  "rank's description is the same",
                  group.name()));
}

// Copies rank 0's tensors into every rank's, one broadcast per (dtype, device).
void broadcast_from_rank0(ProcessGroup& group, const std::vector<Tensor>& tensors,
                          Nanoseconds timeout) {
  std::map<std::pair<DType, std::string>, std::vector<Tensor>> by_kind;
  for (const Tensor& t : tensors) by_kind[{t.dtype(), t.device().str()}].push_back(t);
  NoGradGuard no_grad;  // writes into parameters in place
  for (auto& [kind, list] : by_kind) {
    std::vector<Tensor> flat_parts;
    for (const Tensor& t : list) flat_parts.push_back(reshape(t, {t.numel()}));
    Tensor flat = cat(flat_parts, 0);
    group.broadcast(flat, {.root = 0, .timeout = timeout});
    int64_t offset = 0;
    for (const Tensor& t : list) {
      copy_(t, view(narrow(flat, 0, offset, t.numel()), t.shape()));
      offset += t.numel();
    }
  }
}

std::shared_ptr<ProcessGroup> resolve_group(const DeviceMesh& mesh, const std::string& dim) {
  const std::vector<std::string> names = mesh.dim_names();
  if (dim.empty()) {
    TESSEL_CHECK(mesh.ndim() == 1, InvalidArgument,
                 "replicate: mesh {} has {} dimensions; name the replicate dimension "
                 "(ReplicateOptions::dim)",
                 mesh.shape_str(), mesh.ndim());
    return mesh.group();
  }
  TESSEL_CHECK(std::find(names.begin(), names.end(), dim) != names.end(), InvalidArgument,
               "replicate: mesh {} has no dimension '{}'; its dimensions are ({})",
               mesh.shape_str(), dim, fmt::join(names, ", "));
  return mesh.group(dim);
}

}  // namespace

// ---- State: buckets, per-pass bookkeeping, the hooks' work ------------------------------------

struct DDPModule::State : std::enable_shared_from_this<DDPModule::State> {
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket = 0;
    size_t slot = 0;     // index in the bucket
    int64_t offset = 0;  // element offset in the bucket's buffer
    bool ready = false;  // its gradient of this pass is final
  };
  struct Bucket {
    DType dtype = DType::kF32;
    Device device;
    std::vector<size_t> params;  // indices into State::params, in fill order
    int64_t numel = 0;           // gradient elements; one flag per parameter follows them
    Tensor buffer;
    size_t pending = 0;  // parameters not yet ready in this pass
    Work work;
  };

  std::shared_ptr<ProcessGroup> group;
  Nanoseconds timeout{0};
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  DDPStats stats;

  bool requires_sync = true;
  std::optional<bool> forward_sync;  // requires_sync when the module's forward last ran
  // The backward pass now running (if any).
  bool in_pass = false;
  bool pass_syncs = false;
  size_t next_bucket = 0;  // buckets [0, next_bucket) have started
  // The flight recorder's "ddp backward" span: from the pass's first activity to its end.
  ComputeSpan backward_span;

  void build_buckets(int64_t bucket_bytes);
  void on_forward();
  void on_backward_activity();
  void on_gradient_ready(size_t index);
  void start(size_t bucket, bool from_hook);
  void end_pass();
  void finish_sync();
  void reset_pass();
  // Started calls that have not finished keep reading their buckets' buffers: give those
  // buckets new ones, so the next pass cannot write under them.
  void abandon_in_flight();
  // The buffer's slice holding parameter `p`'s gradient, in the parameter's shape.
  Tensor slot_view(const Bucket& b, const Param& p) const {
    return view(narrow(b.buffer, 0, p.offset, p.tensor.numel()), p.tensor.shape());
  }
  // Gradients, then one "has a gradient" flag per parameter.
  static Tensor new_buffer(const Bucket& b) {
    return zeros({b.numel + static_cast<int64_t>(b.params.size())}, b.dtype, b.device);
  }
  Tensor flags(const Bucket& b) const {
    return narrow(b.buffer, 0, b.numel, static_cast<int64_t>(b.params.size()));
  }
};

void DDPModule::State::build_buckets(int64_t bucket_bytes) {
  // Reverse parameter order: backward finishes the last layers' gradients first. One open bucket
  // per (dtype, device); a full one is closed and a new one opened behind it.
  std::map<std::pair<DType, std::string>, size_t> open;
  for (size_t i = params.size(); i-- > 0;) {
    Param& p = params[i];
    const auto key = std::make_pair(p.tensor.dtype(), p.tensor.device().str());
    auto it = open.find(key);
    if (it != open.end()) {
      const Bucket& b = buckets[it->second];
      const int64_t bytes =
          (b.numel + p.tensor.numel()) * static_cast<int64_t>(p.tensor.element_size());
      if (bytes > bucket_bytes) {
        open.erase(it);
        it = open.end();
      }
    }
    if (it == open.end()) {
      buckets.push_back(Bucket{.dtype = p.tensor.dtype(), .device = p.tensor.device()});
      it = open.emplace(key, buckets.size() - 1).first;
    }
    Bucket& b = buckets[it->second];
    p.bucket = it->second;
    p.slot = b.params.size();
    p.offset = b.numel;
    b.params.push_back(i);
    b.numel += p.tensor.numel();
  }
  for (Bucket& b : buckets) {
    b.buffer = new_buffer(b);
    b.pending = b.params.size();
  }
}

void DDPModule::State::on_forward() {
  if (in_backward()) return;  // a forward recomputed inside backward (checkpointing)
  forward_sync = requires_sync;
  if (!in_pass) return;
  // The last backward stopped (threw) before its end-of-backward callback. Calls it started may
  // still read their buffers: give those buckets new ones, then start afresh.
  const bool synced = pass_syncs;
  const size_t started = next_bucket;
  abandon_in_flight();
  reset_pass();
  TESSEL_CHECK(!synced, InvalidArgument,
               "replicate over group '{}': the previous backward pass ended before averaging its "
               "gradients ({} of {} buckets had started); the gradients of that pass are not "
               "averaged and the ranks may now disagree on the collectives issued",
               group->name(), started, buckets.size());
}

void DDPModule::State::on_backward_activity() {
  if (in_pass) return;
  in_pass = true;
  pass_syncs = forward_sync.value_or(requires_sync);
  backward_span = ComputeSpan("ddp backward", buckets.empty() ? Device::cpu() : buckets[0].device);
  // Ends the pass after the whole graph is processed, before backward() returns.
  queue_callback([weak = weak_from_this()] {
    if (auto state = weak.lock()) state->end_pass();
  });
}

void DDPModule::State::on_gradient_ready(size_t index) {
  on_backward_activity();
  if (!pass_syncs) return;
  Param& p = params[index];
  if (p.ready) return;
  p.ready = true;
  if (--buckets[p.bucket].pending > 0) return;
  // Start every bucket that is complete and has no unstarted bucket before it.
  while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
    start(next_bucket++, /*from_hook=*/true);
  }
}

void DDPModule::State::start(size_t index, bool from_hook) {
  Bucket& b = buckets[index];
  NoGradGuard no_grad;
  for (size_t i : b.params) {
    const Param& p = params[i];
    const Tensor grad = p.tensor.grad();
    const Tensor slot = slot_view(b, p);
    const Tensor flag = narrow(b.buffer, 0, b.numel + static_cast<int64_t>(p.slot), 1);
    if (grad.defined()) {
      copy_(slot, grad);
      fill_(flag, 1.0);
    } else {
      fill_(slot, 0.0);
      fill_(flag, 0.0);
    }
  }
  b.work = group->all_reduce(b.buffer, {.op = ReduceOp::kAvg, .timeout = timeout, .async = true});
  ++stats.all_reduces;
  if (from_hook) ++stats.started_in_backward;
}

void DDPModule::State::end_pass() {
  backward_span.end();
  struct ResetOnExit {
    State& state;
    ~ResetOnExit() { state.reset_pass(); }
  } reset{*this};
  if (!pass_syncs) return;
  try {
    finish_sync();
  } catch (...) {
    abandon_in_flight();  // a failed or timed-out wait
    throw;
  }
}

void DDPModule::State::abandon_in_flight() {
  for (size_t i = 0; i < next_bucket; ++i) {
    Bucket& b = buckets[i];
    if (b.work.is_completed()) continue;
    b.buffer = new_buffer(b);
  }
}

void DDPModule::State::finish_sync() {
  // Buckets held up by a parameter without a gradient in this pass start now, in order.
  while (next_bucket < buckets.size()) start(next_bucket++, /*from_hook=*/false);
  Stopwatch waiting;
  for (Bucket& b : buckets) b.work.wait(timeout);
  stats.exposed_wait += waiting.elapsed();
  NoGradGuard no_grad;
  for (Bucket& b : buckets) {
    const std::vector<float> used = to_vector<float>(to(flags(b), DType::kF32));
    for (size_t k = 0; k < b.params.size(); ++k) {
      if (used[k] <= 0) continue;  // no rank had a gradient: leave it undefined
      const Param& p = params[b.params[k]];
      const Tensor average = slot_view(b, p);
      const Tensor grad = p.tensor.grad();
      if (grad.defined()) {
        copy_(grad, average);
      } else {
        p.tensor.set_grad(clone(average));
      }
    }
  }
  ++stats.synced_backwards;
}

void DDPModule::State::reset_pass() {
  backward_span.end();
  in_pass = false;
  pass_syncs = false;
  next_bucket = 0;
  for (Param& p : params) p.ready = false;
  for (Bucket& b : buckets) {
    b.pending = b.params.size();
    b.work = Work();
  }
}

// ---- DDPModule ---------------------------------------------------------------------------------

DDPModule::DDPModule(nn::Module& module, std::shared_ptr<State> state)
    : module_(&module), state_(std::move(state)) {
  std::weak_ptr<State> weak = state_;
  hooks_.push_back(module.register_forward_pre_hook([weak](nn::Module&, nn::Tensors&) {
    if (auto s = weak.lock()) s->on_forward();
  }));
  // Backward reaching the module's outputs starts the pass, so its end runs even when no
  // parameter of this rank gets a gradient.
  hooks_.push_back(module.register_backward_pre_hook([weak](nn::Module&, nn::Tensors&) {
    if (auto s = weak.lock()) s->on_backward_activity();
  }));
  for (size_t i = 0; i < state_->params.size(); ++i) {
    register_post_accumulate_grad_hook(state_->params[i].tensor, [weak, i](const Tensor&) {
      if (auto s = weak.lock()) s->on_gradient_ready(i);
    });
  }
}

DDPModule::DDPModule(DDPModule&& other) noexcept
    : module_(std::exchange(other.module_, nullptr)),
      state_(std::move(other.state_)),
      hooks_(std::move(other.hooks_)) {}

DDPModule& DDPModule::operator=(DDPModule&& other) noexcept {
  if (this != &other) {
    remove_hooks();
    module_ = std::exchange(other.module_, nullptr);
    state_ = std::move(other.state_);
    hooks_ = std::move(other.hooks_);
  }
  return *this;
}

DDPModule::~DDPModule() { remove_hooks(); }

void DDPModule::remove_hooks() {
  if (module_ != nullptr) {
    for (const nn::HookHandle& h : hooks_) module_->remove_hook(h);
  }
  hooks_.clear();
  state_.reset();  // the parameter hooks hold weak references: they now do nothing
}

ProcessGroup& DDPModule::group() const { return *state_->group; }

void DDPModule::set_requires_gradient_sync(bool sync) { state_->requires_sync = sync; }
bool DDPModule::requires_gradient_sync() const { return state_->requires_sync; }
void DDPModule::set_next_backward_sync(bool sync) { state_->forward_sync = sync; }

DDPModule::NoSyncGuard::NoSyncGuard(DDPModule& ddp)
    : ddp_(ddp), previous_(ddp.requires_gradient_sync()) {
  ddp_.set_requires_gradient_sync(false);
}
DDPModule::NoSyncGuard::~NoSyncGuard() { ddp_.set_requires_gradient_sync(previous_); }

std::vector<DDPBucket> DDPModule::buckets() const {
  std::vector<DDPBucket> out;
  for (const State::Bucket& b : state_->buckets) {
    DDPBucket info{.dtype = b.dtype, .numel = b.numel};
    for (size_t i : b.params) info.parameters.push_back(state_->params[i].name);
    out.push_back(std::move(info));
  }
  return out;
}

DDPStats DDPModule::stats() const { return state_->stats; }

DDPModule replicate(nn::Module& module, const DeviceMesh& mesh, ReplicateOptions options) {
  TESSEL_CHECK(options.bucket_bytes > 0, InvalidArgument,
               "replicate: bucket_bytes must be positive, got {}", options.bucket_bytes);
  TESSEL_CHECK(options.timeout >= Nanoseconds::zero(), InvalidArgument,
               "replicate: timeout {} is negative", format_duration(options.timeout));
  auto state = std::make_shared<DDPModule::State>();
  state->group = resolve_group(mesh, options.dim);
  ProcessGroup& group = *state->group;
  state->timeout =
      options.timeout > Nanoseconds::zero() ? options.timeout : group.default_timeout();
  check_same_model(group, module, state->timeout);
  if (options.broadcast_from_rank0 && group.size() > 1) {
    std::vector<Tensor> tensors = module.parameters();
    for (const auto& [name, b] : module.named_buffers()) tensors.push_back(b);
    broadcast_from_rank0(group, tensors, state->timeout);
  }
  for (const auto& [name, p] : module.named_parameters()) {
    if (p.requires_grad()) state->params.push_back({.name = name, .tensor = p});
  }
  state->build_buckets(options.bucket_bytes);
  return DDPModule(module, std::move(state));
}

}  // namespace tessel
