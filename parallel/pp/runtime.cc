// The pipeline runtime: one rank's schedule, executed. See runtime.h.
#include "tessel/parallel/pp/runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "tessel/base/error.h"
#include "tessel/collectives/compute_span.h"
#include "tessel/flight_recorder/record_text.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/pp/schedule_validate.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/deferred_grad.h"
#include "tessel/tensor/ops.h"

namespace tessel::pp {
namespace {

// The first message of a boundary: dtype, rank, then up to kMaxDims sizes.
constexpr int kMaxDims = 6;
constexpr int64_t kHeaderSize = 2 + kMaxDims;

// FNV-1a of a schedule's text form: what ranks compare to agree on the schedule.
int64_t schedule_hash(const PipelineSchedule& schedule) {
  uint64_t h = 1469598103934665603ull;
  for (char c : format_schedule(schedule)) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

// A one-way channel: tensors of one kind (activations or gradients) from rank src to rank dst.
struct ChannelKey {
  bool gradient = false;
  int src = 0;
  int dst = 0;
  auto operator<=>(const ChannelKey&) const = default;
};

// A tensor kind crossing one stage boundary (between stage b and b + 1) in one direction.
struct BoundaryKey {
  bool gradient = false;
  int boundary = 0;
  auto operator<=>(const BoundaryKey&) const = default;
};

BoundaryKey boundary_of(const Action& a) {
  switch (a.kind) {
    case ActionKind::kSendActivation:
      return {false, a.stage};
    case ActionKind::kRecvActivation:
      return {false, a.stage - 1};
    case ActionKind::kSendGradient:
      return {true, a.stage - 1};
    default:  // kRecvGradient
      return {true, a.stage};
  }
}

ChannelKey channel_of(const Action& a, int rank) {
  const bool gradient = a.kind == ActionKind::kSendGradient || a.kind == ActionKind::kRecvGradient;
  return is_send(a.kind) ? ChannelKey{gradient, rank, a.peer} : ChannelKey{gradient, a.peer, rank};
}

// The forward state of one micro-batch on one stage, from its F to its BW (or W).
struct MicroState {
  Tensor input;         // the stage's input as an autograd leaf (stages > 0)
  Tensor output;        // the stage's output (the last stage: its scaled loss)
  Tensor input_buffer;  // the receive buffer the input came in, returned to the pool at release
  // Split backward (B then W): the weight gradients B deferred, run by W, and the receive
  // buffer of the output gradient they read, returned to the pool at release.
  std::shared_ptr<DeferredWeightGrads> weight_grads;
  Tensor gradient_buffer;
  bool held = false;
};

// What the flight recorder notes on a send or receive: "pipeline RECV_F1s1<0: mb 1, stage 1".
std::string record_text(const Action& a) {
  return fmt::format("pipeline {}: mb {}, stage {}", to_string(a), a.microbatch, a.stage);
}

// A compute action's flight-recorder span, "F mb3 s1" ("B", "W", "BW"); inactive for the other
// actions. `tessel-trace export` draws these on each rank's pipeline track (bubbles are the gaps)
// and a hang's verdict names the one a stuck stage is in. No allocation.
ComputeSpan action_span(const Action& a, Device device) {
  if (!is_compute(a.kind)) return {};
  const char* kind = a.kind == ActionKind::kForward          ? "F"
                     : a.kind == ActionKind::kBackwardInput  ? "B"
                     : a.kind == ActionKind::kBackwardWeight ? "W"
                                                             : "BW";
  char text[40];
  const auto end = fmt::format_to_n(text, sizeof(text), "{} mb{} s{}", kind, a.microbatch, a.stage);
  return ComputeSpan(std::string_view(text, end.out - text), device);
}

}  // namespace

struct PipelineRuntime::Impl {
  PipelineLoss loss;
  PipelineOptions options;
  int rank = 0;
  int p = 0;
  int S = 0;
  int m = 0;
  std::map<ChannelKey, std::shared_ptr<ProcessGroup>> channels;
  // Tied parameters: the group of the ranks holding each (null when one rank holds it), and
  // whether this rank counts it in the norm.
  struct Tied {
    Tensor param;
    std::shared_ptr<ProcessGroup> group;
    bool counted = true;
  };
  std::vector<Tied> tied;
  std::map<int, int> local_index;  // stage -> index into stages_

  // Shapes agreed so far (sender: header sent; receiver: header received).
  std::map<BoundaryKey, std::pair<DType, Shape>> shapes;
  std::map<BoundaryKey, std::vector<Tensor>> free_buffers;
  Device device = Device::cpu();

  // Per step.
  std::vector<std::vector<MicroState>> state;          // [local stage][micro-batch]
  std::vector<std::vector<Tensor>> activation_in;      // received or handed over, before F
  std::vector<std::vector<Tensor>> activation_buffer;  // the receive buffer behind activation_in
  std::vector<std::vector<Tensor>> gradient_in;        // output gradients, before B/BW
  std::vector<std::vector<Tensor>> gradient_buffer;
  std::vector<std::vector<Tensor>> gradient_out;  // input gradients, for SEND_B
  std::vector<Tensor> inputs, targets;            // the micro-batches
  std::vector<std::pair<Work, Tensor>> pending_sends;
  // Receives posted ahead: action index -> (work, buffer).
  std::map<size_t, std::pair<Work, Tensor>> posted;
  size_t next_to_post = 0;  // the scan position for receives to post ahead
  int held_rank = 0;
  std::vector<int> held;
  double loss_sum = 0;

  Tensor acquire(const BoundaryKey& key, PipelineStats& stats) {
    auto& pool = free_buffers[key];
    if (!pool.empty()) {
      Tensor t = pool.back();
      pool.pop_back();
      return t;
    }
    ++stats.buffers_allocated;
    const auto& [dtype, shape] = shapes.at(key);
    return empty(shape, dtype, device);
  }
  void release(const BoundaryKey& key, const Tensor& buffer) {
    if (buffer.defined()) free_buffers[key].push_back(buffer);
  }
};

PipelineRuntime::PipelineRuntime(std::shared_ptr<ProcessGroup> group, PipelineSchedule schedule,
                                 std::vector<LocalStage> stages, PipelineLoss loss,
                                 PipelineOptions options)
    : group_(std::move(group)),
      schedule_(std::move(schedule)),
      stages_(std::move(stages)),
      impl_(std::make_unique<Impl>()) {
  TESSEL_CHECK(group_ != nullptr, InvalidArgument, "PipelineRuntime: no process group");
  Impl& I = *impl_;
  I.loss = std::move(loss);
  I.options = std::move(options);
  I.rank = group_->rank();
  I.p = group_->size();
  TESSEL_CHECK(schedule_.num_ranks == I.p, InvalidArgument,
               "pipeline schedule '{}' is for {} ranks; the pipeline group '{}' has {}",
               schedule_.name, schedule_.num_ranks, group_->name(), I.p);
  // Pure data: every rank reaches the same verdict and message.
  validate_schedule(schedule_);
  I.S = schedule_.num_stages;
  I.m = schedule_.num_microbatches;
  TESSEL_CHECK(I.options.recv_lookahead >= 0, InvalidArgument,
               "PipelineOptions::recv_lookahead {} must be >= 0", I.options.recv_lookahead);

  // Every rank runs the same schedule.
  if (I.p > 1 && I.options.check_schedule_agreement) {
    // Each rank's hash, stage and micro-batch counts and name, so the message names what differs.
    constexpr int64_t kNameChars = 32;
    std::vector<int64_t> mine = {schedule_hash(schedule_), schedule_.num_stages,
                                 schedule_.num_microbatches};
    for (int64_t c = 0; c < kNameChars; ++c) {
      mine.push_back(c < static_cast<int64_t>(schedule_.name.size())
                         ? static_cast<unsigned char>(schedule_.name[static_cast<size_t>(c)])
                         : 0);
    }
    const int64_t width = static_cast<int64_t>(mine.size());
    Tensor all = empty({I.p * width}, DType::kI64, group_->default_device());
    group_->all_gather(to(from_vector<int64_t>(mine), group_->default_device()), all);
    all = to(all, Device::cpu());
    const int64_t* v = all.data<int64_t>();
    auto describe = [&](int r) {
      const int64_t* row = v + r * width;
      std::string name;
      for (int64_t c = 0; c < kNameChars && row[3 + c] != 0; ++c) {
        name.push_back(static_cast<char>(row[3 + c]));
      }
      return fmt::format("rank {} runs '{}' ({} stages, {} micro-batches)", r, name, row[1],
                         row[2]);
    };
    std::vector<int> differ;
    std::vector<std::string> described = {describe(0)};
    for (int r = 0; r < I.p; ++r) {
      if (v[r * width] != v[0]) {
        differ.push_back(r);
        described.push_back(describe(r));
      }
    }
    const bool same_outline = std::all_of(differ.begin(), differ.end(), [&](int r) {
      return std::equal(v + 1, v + width, v + r * width + 1);
    });
    TESSEL_CHECK(differ.empty(), InvalidArgument,
                 "pipeline group '{}': ranks {} run a schedule that differs from rank 0's: {}{} "
                 "(this is rank {}); every rank must run the same schedule",
                 group_->name(), fmt::join(differ, ","), fmt::join(described, "; "),
                 same_outline ? " (the same name and sizes, different action lists)" : "", I.rank);
  }

  // The stages are exactly this rank's.
  std::vector<int> expected, given;
  for (int s = I.rank; s < I.S; s += I.p) expected.push_back(s);
  for (size_t i = 0; i < stages_.size(); ++i) {
    TESSEL_CHECK(stages_[i].module != nullptr, InvalidArgument,
                 "PipelineRuntime: stage {} has no module", stages_[i].stage);
    TESSEL_CHECK(stages_[i].ddp == nullptr || &stages_[i].ddp->module() == stages_[i].module.get(),
                 InvalidArgument,
                 "PipelineRuntime: stage {}'s DDP handle replicates another module; pass the "
                 "handle replicate() returned for the stage's module",
                 stages_[i].stage);
    given.push_back(stages_[i].stage);
    I.local_index[stages_[i].stage] = static_cast<int>(i);
  }
  TESSEL_CHECK(given == expected, InvalidArgument,
               "PipelineRuntime on rank {}: given stages [{}], but schedule '{}' ({} stages over "
               "{} ranks) runs stages [{}] here, in that order",
               I.rank, fmt::join(given, ","), schedule_.name, I.S, I.p, fmt::join(expected, ","));
  for (const auto& st : stages_) {
    for (const Tensor& t : st.module->parameters()) {
      I.device = t.device();
      break;
    }
  }

  // Point-to-point groups: one per channel the schedule uses, split in rounds in which every
  // rank joins at most one (a split gives each rank one group).
  std::set<ChannelKey> needed;
  for (int r = 0; r < I.p; ++r) {
    for (const Action& a : schedule_.ranks[r]) {
      if (is_send(a.kind)) needed.insert(channel_of(a, r));
    }
  }
  std::vector<std::vector<ChannelKey>> rounds;
  for (const ChannelKey& c : needed) {
    auto fits = [&](const std::vector<ChannelKey>& round) {
      return std::none_of(round.begin(), round.end(), [&](const ChannelKey& o) {
        return o.src == c.src || o.src == c.dst || o.dst == c.src || o.dst == c.dst;
      });
    };
    auto it = std::find_if(rounds.begin(), rounds.end(), fits);
    if (it == rounds.end()) it = rounds.insert(rounds.end(), std::vector<ChannelKey>{});
    it->push_back(c);
  }
  for (const auto& round : rounds) {
    const ChannelKey* mine = nullptr;
    int color = kNoColor;
    for (size_t i = 0; i < round.size(); ++i) {
      if (round[i].src == I.rank || round[i].dst == I.rank) {
        mine = &round[i];
        color = static_cast<int>(i);
      }
    }
    // Every rank names its members (a rank outside this round's channels a group of its own),
    // so the split is the same single collective everywhere.
    SplitOptions split;
    if (mine != nullptr) {
      split.members = {mine->src, mine->dst};
      split.name = fmt::format("{}/pp_{}{}>{}", group_->name(), mine->gradient ? "grad" : "act",
                               mine->src, mine->dst);
    } else {
      color = static_cast<int>(round.size()) + I.rank;
      split.members = {I.rank};
      split.name = fmt::format("{}/pp_idle{}", group_->name(), I.rank);
    }
    auto sub = group_->split(color, 0, split);
    if (mine != nullptr) I.channels[*mine] = std::move(sub);
  }

  // Tied parameters: who holds each, and a group of the holders when they are several ranks.
  if (!I.options.tied_parameters.empty()) {
    const auto named = named_parameters();
    std::vector<int64_t> flags;
    std::vector<Tensor> found;
    for (const std::string& name : I.options.tied_parameters) {
      auto it = std::find_if(named.begin(), named.end(),
                             [&](const auto& np) { return np.first == name; });
      flags.push_back(it != named.end() ? 1 : 0);
      found.push_back(it != named.end() ? it->second : Tensor());
    }
    const int64_t n = static_cast<int64_t>(flags.size());
    Tensor all = from_vector<int64_t>(flags);
    if (I.p > 1) {
      Tensor gathered = empty({n * I.p}, DType::kI64, group_->default_device());
      group_->all_gather(to(all, group_->default_device()), gathered);
      all = to(gathered, Device::cpu());
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int> holders;
      for (int r = 0; r < I.p; ++r) {
        if (all.data<int64_t>()[r * n + t] != 0) holders.push_back(r);
      }
      TESSEL_CHECK(!holders.empty(), InvalidArgument,
                   "PipelineOptions::tied_parameters: no stage holds '{}'",
                   I.options.tied_parameters[static_cast<size_t>(t)]);
      const bool mine = flags[static_cast<size_t>(t)] != 0;
      std::shared_ptr<ProcessGroup> tied_group;
      if (holders.size() > 1) {
        SplitOptions split;
        split.members = mine ? holders : std::vector<int>{I.rank};
        split.name = mine ? fmt::format("{}/pp_tied{}", group_->name(), t)
                          : fmt::format("{}/pp_idle{}", group_->name(), I.rank);
        tied_group = group_->split(mine ? 0 : 1 + I.rank, 0, split);
      }
      if (mine) I.tied.push_back({found[static_cast<size_t>(t)], tied_group, holders[0] == I.rank});
    }
  }
  stats_.peak_in_flight.assign(stages_.size(), 0);
}

PipelineRuntime::~PipelineRuntime() = default;

std::vector<std::pair<std::string, Tensor>> PipelineRuntime::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<const void*> seen;
  for (const auto& st : stages_) {
    for (auto& [name, t] : st.module->named_parameters()) {
      if (seen.insert(t.impl_ptr().get()).second) out.emplace_back(name, t);
    }
  }
  return out;
}

std::vector<Tensor> PipelineRuntime::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor> PipelineRuntime::norm_parameters() const {
  std::vector<Tensor> out;
  for (const Tensor& t : parameters()) {
    const bool skip = std::any_of(impl_->tied.begin(), impl_->tied.end(), [&](const auto& tied) {
      return tied.param.impl_ptr() == t.impl_ptr() && !tied.counted;
    });
    if (!skip) out.push_back(t);
  }
  return out;
}

namespace {

// Throws InvalidArgument unless dim 0 of `t` divides into m micro-batches.
void check_batch(const Tensor& t, int m, const char* what) {
  TESSEL_CHECK(t.defined() && t.dim() >= 1, InvalidArgument,
               "pipeline step: the {} are {}; expected a batch with rows on dim 0", what,
               t.defined() ? shape_str(t.shape()) : std::string("undefined"));
  TESSEL_CHECK(t.size(0) >= m && t.size(0) % m == 0, InvalidArgument,
               "pipeline step: the {} {} have {} rows, which the schedule's {} micro-batches do "
               "not divide; use a batch of a multiple of {} rows",
               what, shape_str(t.shape()), t.size(0), m, m);
}

// Cuts dim 0 of a batch into m contiguous micro-batches.
std::vector<Tensor> split_batch(const Tensor& t, int m, const char* what) {
  check_batch(t, m, what);
  const int64_t rows = t.size(0) / m;
  std::vector<Tensor> out;
  for (int i = 0; i < m; ++i) out.push_back(contiguous(narrow(t, 0, i * rows, rows)));
  return out;
}

}  // namespace

double PipelineRuntime::step(const Tensor& inputs, const Tensor& targets) {
  Impl& I = *impl_;
  const int m = I.m;
  const int S = I.S;
  const size_t L = stages_.size();
  const bool has_first = I.local_index.count(0) != 0;
  const bool has_last = I.local_index.count(S - 1) != 0;
  // Every rank checks what it is given, so a batch m does not divide fails on every rank it
  // is passed to, before anything is sent.
  if (inputs.defined()) check_batch(inputs, m, "inputs");
  if (targets.defined()) check_batch(targets, m, "targets");
  I.inputs = has_first ? split_batch(inputs, m, "inputs") : std::vector<Tensor>{};
  I.targets = has_last ? split_batch(targets, m, "targets") : std::vector<Tensor>{};
  for (const auto& st : stages_) st.module->zero_grad();
  auto table = [&] { return std::vector<std::vector<Tensor>>(L, std::vector<Tensor>(m)); };
  I.state.assign(L, std::vector<MicroState>(static_cast<size_t>(m)));
  I.activation_in = table();
  I.activation_buffer = table();
  I.gradient_in = table();
  I.gradient_buffer = table();
  I.gradient_out = table();
  I.pending_sends.clear();
  I.posted.clear();
  I.next_to_post = 0;
  I.held.assign(L, 0);
  I.held_rank = 0;
  I.loss_sum = 0;

  const Nanoseconds timeout = I.options.timeout;
  const auto& actions = schedule_.ranks[static_cast<size_t>(I.rank)];
  auto local = [&](int stage) { return static_cast<size_t>(I.local_index.at(stage)); };

  // FSDP stages: gradients accumulate unsharded until the stage's last backward of the step,
  // which reduce-scatters them; with gather-once the parameters stay gathered until then.
  std::vector<FSDPModule*> fsdp(L, nullptr);
  std::vector<size_t> last_backward(L, 0);
  for (size_t k = 0; k < actions.size(); ++k) {
    const ActionKind kind = actions[k].kind;
    if (kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput) {
      last_backward[local(actions[k].stage)] = k;
    }
  }
  for (size_t li = 0; li < L; ++li) {
    fsdp[li] = fsdp_module(*stages_[li].module);
    if (fsdp[li] == nullptr) continue;
    fsdp[li]->set_requires_gradient_sync(false);
    if (I.options.fsdp_gather_once_per_step) {
      fsdp[li]->set_reshard_after_backward(false);
      // From the second step: the first forward checks the shards across ranks before any gather.
      if (stats_.steps > 0) fsdp[li]->unshard(/*async=*/true);
    }
  }
  auto is_local = [&](int stage) { return schedule_.stage_rank(stage) == I.rank; };

  // Receives, posted ahead while their shapes are known, in list order (so in each channel's
  // message order).
  auto post_ahead = [&](size_t k) {
    I.next_to_post = std::max(I.next_to_post, k);
    while (I.posted.size() < static_cast<size_t>(I.options.recv_lookahead) &&
           I.next_to_post < actions.size()) {
      const Action& a = actions[I.next_to_post];
      if (is_recv(a.kind)) {
        const BoundaryKey key = boundary_of(a);
        if (I.shapes.count(key) == 0) break;
        Tensor buffer = I.acquire(key, stats_);
        const fr::ScopedRecordText text(record_text(a));
        Work w = I.channels.at(channel_of(a, I.rank))
                     ->recv(buffer, 0, {.timeout = timeout, .async = true});
        I.posted.emplace(I.next_to_post, std::make_pair(std::move(w), buffer));
        if (I.next_to_post > k) ++stats_.recvs_posted_early;
      }
      ++I.next_to_post;
    }
  };
  // The tensor a receive action delivers, and the pooled buffer it lives in.
  auto receive = [&](size_t k, const Action& a) -> Tensor {
    ++stats_.recvs;
    auto it = I.posted.find(k);
    if (it != I.posted.end()) {
      it->second.first.wait();
      Tensor buffer = it->second.second;
      I.posted.erase(it);
      return buffer;
    }
    const BoundaryKey key = boundary_of(a);
    ProcessGroup& channel = *I.channels.at(channel_of(a, I.rank));
    const fr::ScopedRecordText text(record_text(a));
    if (I.shapes.count(key) == 0) {
      Tensor header = empty({kHeaderSize}, DType::kI64, channel.default_device());
      channel.recv(header, 0, {.timeout = timeout});
      header = to(header, Device::cpu());
      const int64_t* h = header.data<int64_t>();
      TESSEL_CHECK(h[0] >= 0 && h[0] < kDTypeCount && h[1] >= 0 && h[1] <= kMaxDims, CommError,
                   "pipeline {}: the shape header from rank {} is corrupt", to_string(a), a.peer);
      I.shapes[key] = {static_cast<DType>(h[0]), Shape(h + 2, h + 2 + h[1])};
    }
    Tensor buffer = I.acquire(key, stats_);
    channel.recv(buffer, 0, {.timeout = timeout});
    return buffer;
  };
  auto send = [&](const Action& a, const Tensor& tensor) {
    ++stats_.sends;
    const BoundaryKey key = boundary_of(a);
    ProcessGroup& channel = *I.channels.at(channel_of(a, I.rank));
    const fr::ScopedRecordText text(record_text(a));
    Tensor t = contiguous(detach(tensor));
    auto known = I.shapes.find(key);
    if (known == I.shapes.end()) {
      TESSEL_CHECK(t.dim() <= kMaxDims, InvalidArgument,
                   "pipeline {}: a tensor of {} dims crosses the stage boundary; at most {}",
                   to_string(a), t.dim(), kMaxDims);
      std::vector<int64_t> h(kHeaderSize, 0);
      h[0] = static_cast<int64_t>(t.dtype());
      h[1] = t.dim();
      for (int64_t d = 0; d < t.dim(); ++d) h[static_cast<size_t>(2 + d)] = t.size(d);
      Tensor header = to(from_vector<int64_t>(h), channel.default_device());
      I.pending_sends.emplace_back(channel.send(header, 1, {.timeout = timeout, .async = true}),
                                   header);
      I.shapes[key] = {t.dtype(), t.shape()};
    } else {
      TESSEL_CHECK(
          known->second.first == t.dtype() && known->second.second == t.shape(), InvalidArgument,
          "pipeline {}: the tensor is {} but the shape agreed at the first step is {} "
          "{}; a pipeline's shapes must stay the same from step to step",
          to_string(a), t.str(), dtype_name(known->second.first), shape_str(known->second.second));
    }
    I.pending_sends.emplace_back(channel.send(t, 1, {.timeout = timeout, .async = true}), t);
  };
  auto release = [&](size_t li, int stage, int mb) {
    MicroState& st = I.state[li][static_cast<size_t>(mb)];
    if (!st.held) return;
    I.release({false, stage - 1}, st.input_buffer);
    I.release({true, stage}, st.gradient_buffer);
    st = MicroState{};
    --I.held[li];
    --I.held_rank;
  };
  auto finish = [&](bool run_on_step) {
    for (auto& [work, tensor] : I.pending_sends) work.wait();
    I.pending_sends.clear();
    NoGradGuard no_grad;
    for (auto& tied : I.tied) {
      if (tied.group == nullptr) continue;
      Tensor g = tied.param.grad();
      if (!g.defined()) {
        g = zeros_like(tied.param);
        tied.param.set_grad(g);
      }
      tied.group->all_reduce(g);
    }
    if (run_on_step && I.options.on_step) I.options.on_step();
  };

  bool stepped = false;
  for (size_t k = 0; k < actions.size(); ++k) {
    const Action& a = actions[k];
    // Covers the test hook too: a stage stuck there is stuck in this action.
    const ComputeSpan span = action_span(a, group_->default_device());
    if (I.options.before_action && !I.options.before_action(a)) continue;
    if (I.options.recv_lookahead > 0) post_ahead(k);
    const int mb = a.microbatch;
    const int s = a.stage;
    switch (a.kind) {
      case ActionKind::kForward: {
        const size_t li = local(s);
        MicroState& st = I.state[li][static_cast<size_t>(mb)];
        Tensor x;
        if (s == 0) {
          x = I.inputs[static_cast<size_t>(mb)];
        } else {
          x = detach(I.activation_in[li][static_cast<size_t>(mb)]);
          if (is_floating(x.dtype())) x.set_requires_grad(true);
          st.input_buffer = I.activation_buffer[li][static_cast<size_t>(mb)];
          I.activation_in[li][static_cast<size_t>(mb)] = Tensor();
          I.activation_buffer[li][static_cast<size_t>(mb)] = Tensor();
        }
        st.input = x;
        Tensor out = (*stages_[li].module)(x);
        if (s == S - 1) {
          Tensor l = I.loss(out, I.targets[static_cast<size_t>(mb)]);
          I.loss_sum += item(l);
          st.output = mul(l, 1.0 / m);
        } else {
          st.output = out;
          if (is_local(s + 1)) I.activation_in[local(s + 1)][static_cast<size_t>(mb)] = detach(out);
        }
        st.held = true;
        stats_.peak_in_flight[li] = std::max(stats_.peak_in_flight[li], ++I.held[li]);
        stats_.peak_in_flight_rank = std::max(stats_.peak_in_flight_rank, ++I.held_rank);
        break;
      }
      case ActionKind::kRecvActivation: {
        const size_t li = local(s);
        Tensor buffer = receive(k, a);
        I.activation_in[li][static_cast<size_t>(mb)] = buffer;
        I.activation_buffer[li][static_cast<size_t>(mb)] = buffer;
        break;
      }
      case ActionKind::kSendActivation:
        send(a, I.state[local(s)][static_cast<size_t>(mb)].output);
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        const size_t li = local(s);
        MicroState& st = I.state[li][static_cast<size_t>(mb)];
        if (fsdp[li] != nullptr && k == last_backward[li]) {
          fsdp[li]->set_requires_gradient_sync(true);
          fsdp[li]->set_reshard_after_backward(true);
        }
        // DDP averages in the stage's last backward only (set per backward: forwards of later
        // micro-batches run between a micro-batch's forward and its backward).
        DDPModule* ddp = stages_[li].ddp.get();
        if (ddp != nullptr) ddp->set_next_backward_sync(k == last_backward[li]);
        // B of a split backward leaves linear layers' weight gradients to W. Not under FSDP or
        // DDP: their reduce-scatter or all_reduce wants a parameter's whole gradient within one
        // backward pass.
        const bool split = a.kind == ActionKind::kBackwardInput &&
                           I.options.defer_weight_gradients && fsdp[li] == nullptr &&
                           ddp == nullptr;
        if (split) st.weight_grads = std::make_shared<DeferredWeightGrads>();
        {
          const DeferWeightGradsGuard defer(split ? st.weight_grads.get() : nullptr);
          if (s == S - 1) {
            tessel::backward(st.output);
          } else {
            tessel::backward(st.output, I.gradient_in[li][static_cast<size_t>(mb)]);
          }
        }
        if (s < S - 1) {
          // The deferred weight gradients read the output gradient: its buffer waits for W.
          if (split && !st.weight_grads->empty()) {
            st.gradient_buffer = I.gradient_buffer[li][static_cast<size_t>(mb)];
          } else {
            I.release({true, s}, I.gradient_buffer[li][static_cast<size_t>(mb)]);
          }
          I.gradient_in[li][static_cast<size_t>(mb)] = Tensor();
          I.gradient_buffer[li][static_cast<size_t>(mb)] = Tensor();
        }
        if (split) stats_.weight_grads_deferred += st.weight_grads->deferred_total();
        if (s > 0 && st.input.requires_grad()) {
          Tensor g = st.input.grad();
          if (is_local(s - 1)) {
            I.gradient_in[local(s - 1)][static_cast<size_t>(mb)] = g;
          } else {
            I.gradient_out[li][static_cast<size_t>(mb)] = g;
          }
        }
        st.output = Tensor();  // the graph was freed by backward
        if (a.kind == ActionKind::kBackward) release(li, s, mb);
        break;
      }
      case ActionKind::kBackwardWeight: {
        const size_t li = local(s);
        MicroState& st = I.state[li][static_cast<size_t>(mb)];
        if (st.weight_grads != nullptr) st.weight_grads->run();
        release(li, s, mb);
        break;
      }
      case ActionKind::kSendGradient: {
        const size_t li = local(s);
        send(a, I.gradient_out[li][static_cast<size_t>(mb)]);
        I.gradient_out[li][static_cast<size_t>(mb)] = Tensor();
        break;
      }
      case ActionKind::kRecvGradient: {
        const size_t li = local(s);
        Tensor buffer = receive(k, a);
        I.gradient_in[li][static_cast<size_t>(mb)] = buffer;
        I.gradient_buffer[li][static_cast<size_t>(mb)] = buffer;
        break;
      }
      case ActionKind::kStep:
        finish(true);
        stepped = true;
        break;
    }
  }
  if (!stepped) finish(false);
  ++stats_.steps;

  // The batch's mean loss, from the last stage's rank to every rank (bit-exact through an i64).
  double loss = I.loss_sum / m;
  if (I.p > 1) {
    Tensor bits =
        to(from_vector<int64_t>({std::bit_cast<int64_t>(loss)}), group_->default_device());
    group_->broadcast(bits, {.root = schedule_.stage_rank(S - 1)});
    loss = std::bit_cast<double>(to(bits, Device::cpu()).data<int64_t>()[0]);
  }
  return loss;
}

double clip_grad_norm(PipelineRuntime& runtime, double max_norm) {
  TESSEL_CHECK(max_norm > 0, InvalidArgument, "pp::clip_grad_norm: max_norm must be > 0, got {}",
               max_norm);
  NoGradGuard no_grad;
  double sum_sq = grad_sum_of_squares(runtime.norm_parameters());
  ProcessGroup& group = runtime.group();
  if (group.size() > 1) {
    Tensor total = to(from_vector<float>({static_cast<float>(sum_sq)}), group.default_device());
    group.all_reduce(total);
    sum_sq = item(total);
  }
  const double norm = std::sqrt(sum_sq);
  const double coeff = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coeff < 1.0) {
    for (const Tensor& p : runtime.parameters()) {
      const Tensor g = p.grad();
      if (g.defined()) mul_(g, coeff);
    }
  }
  return norm;
}

}  // namespace tessel::pp
