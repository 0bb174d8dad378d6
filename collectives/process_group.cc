#include "tessel/collectives/process_group.h"

#include <algorithm>
#include <numeric>

#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/internal/group_worker.h"
#include "tessel/collectives/watchdog.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"

namespace tessel {
namespace {

fr::TensorMeta meta_of(const Tensor& t) {
  const std::string_view name = dtype_name(t.dtype());
  return fr::TensorMeta::make(name, t.shape().data(), static_cast<int>(t.dim()));
}

// Counts for a call: the given ones, checked, or an even split of `total`.
std::vector<int64_t> counts_or_even(const std::vector<int64_t>& given, int64_t total, int size,
                                    std::string_view what) {
  if (given.empty()) {
    TESSEL_CHECK(total % size == 0, InvalidArgument,
                 "{}: {} elements do not split evenly over {} ranks; pass per-rank counts", what,
                 total, size);
    return std::vector<int64_t>(static_cast<size_t>(size), total / size);
  }
  TESSEL_CHECK(static_cast<int>(given.size()) == size, InvalidArgument,
               "{}: {} counts given, expected one per rank ({})", what, given.size(), size);
  for (int64_t c : given) {
    TESSEL_CHECK(c >= 0, InvalidArgument, "{}: count {} is negative", what, c);
  }
  return given;
}

int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

uint64_t mix_id(uint64_t parent, uint64_t split_index, int color, std::string_view name) {
  // FNV-1a over the values and the name: the same on every member, distinct per sub-group.
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](uint8_t byte) {
    h ^= byte;
    h *= 1099511628211ULL;
  };
  for (uint64_t v : {parent, split_index, static_cast<uint64_t>(static_cast<int64_t>(color))}) {
    for (int i = 0; i < 8; ++i) mix(static_cast<uint8_t>(v >> (8 * i)));
  }
  for (char c : name) mix(static_cast<uint8_t>(c));
  return h;
}

std::exception_ptr wrap_error(ErrorKind kind, const std::string& message) {
  try {
    throw_error(kind, message);
  } catch (...) {
    return std::current_exception();
  }
}

// The caller's current stream on `t`'s device where streams there run asynchronously (a device
// with a registered runtime); CPU streams are always complete, so nothing to capture.
std::optional<Stream> caller_stream(const Tensor& t) {
  const Device device = t.device();
  if (device.is_cpu() || device.is_meta() || device_count(device.type) == 0) return std::nullopt;
  return current_stream(device);
}

}  // namespace

void CommBackend::check_device(const Tensor& tensor) const {
  TESSEL_CHECK(tensor.device().is_cpu(), InvalidArgument,
               "the {} backend takes CPU tensors, got {}", name(), tensor.str());
}
Device CommBackend::default_device() const { return Device::cpu(); }
void CommBackend::all_to_all_views(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                   const OpContext& ctx) {
  std::optional<StreamGuard> on_stream;
  if (ctx.stream) on_stream.emplace(*ctx.stream);
  std::vector<int64_t> send_counts, recv_counts;
  for (const Tensor& t : inputs) send_counts.push_back(t.numel());
  for (const Tensor& t : outputs) recv_counts.push_back(t.numel());
  const Tensor& like = inputs.front();
  Tensor send = empty({sum_of(send_counts)}, like.dtype(), like.device());
  Tensor recv = empty({sum_of(recv_counts)}, like.dtype(), like.device());
  int64_t at = 0;
  for (const Tensor& in : inputs) {
    copy_(view(narrow(send, 0, at, in.numel()), in.shape()), in);
    at += in.numel();
  }
  OpContext host_waits = ctx;
  host_waits.device_work = nullptr;
  all_to_all(send, recv, send_counts, recv_counts, host_waits);
  at = 0;
  for (const Tensor& out : outputs) {
    copy_(out, view(narrow(recv, 0, at, out.numel()), out.shape()));
    at += out.numel();
  }
}
std::vector<int> CommBackend::missing_ranks(uint64_t) const { return {}; }
void CommBackend::abort(const std::string&) {}
void CommBackend::abort_together(std::span<CommBackend* const> backends,
                                 const std::string& reason) {
  for (CommBackend* b : backends) b->abort(reason);
}

struct ProcessGroup::Call {
  fr::RecordArgs record;
  bool async = false;
  Nanoseconds timeout{0};
  std::optional<Stream> stream;           // the caller's, for device tensors (OpContext::stream)
  std::optional<Event> issued_on_stream;  // recorded on `stream` by issue()
  SteadyClock::time_point issued;         // set by issue()
  std::function<void(const OpContext&)> run;
};

Nanoseconds resolve_group_timeout(const ProcessGroupOptions& options) {
  TESSEL_CHECK(options.timeout >= Nanoseconds::zero(), InvalidArgument,
               "process group '{}': timeout {}ns is negative", options.name,
               options.timeout.count());
  if (options.timeout > Nanoseconds::zero()) return options.timeout;
  const Nanoseconds timeout = env_duration(EnvKnob::kPgTimeout);
  TESSEL_CHECK(timeout > Nanoseconds::zero(), InvalidArgument,
               "TESSEL_PG_TIMEOUT must be positive, got {}", format_duration(timeout));
  return timeout;
}

namespace {
ProcessGroupOptions with_resolved_timeout(ProcessGroupOptions options) {
  options.timeout = resolve_group_timeout(options);
  return options;
}
}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<CommBackend> backend, ProcessGroupOptions options,
                           std::vector<int> global_ranks)
    : backend_(std::move(backend)),
      options_(with_resolved_timeout(std::move(options))),
      global_ranks_(std::move(global_ranks)),
      rank_(backend_->rank()),
      size_(backend_->size()),
      members_text_(std::make_shared<const std::string>(
          fmt::format("world ranks {}", fr::format_rank_list(global_ranks_)))),
      who_(global_ranks_.size() == static_cast<size_t>(size_) && rank_ >= 0 && rank_ < size_
               ? fmt::format("world rank {}; group rank {} of {}", global_ranks_[rank_], rank_,
                             size_)
               : fmt::format("rank {} of {}", rank_, size_)),
      send_seq_(static_cast<size_t>(size_), 0),
      recv_seq_(static_cast<size_t>(size_), 0),
      worker_(std::make_unique<internal::GroupWorker>(options_.name)) {
  TESSEL_CHECK(static_cast<int>(global_ranks_.size()) == size_, InvalidArgument,
               "process group '{}' has {} ranks but {} global ranks were given", options_.name,
               size_, global_ranks_.size());
  fr::FlightRecorder::global().register_group(options_.id, options_.name, global_ranks_);
}

ProcessGroup::~ProcessGroup() {
  destroying_.store(true);  // queued operations of a failed transport are not run (execute)
  worker_->stop();
  // The backend before the operations in flight: NCCL lets its communication stream drain first,
  // so their tensors are released once the device is done with them.
  backend_.reset();
}

std::string_view ProcessGroup::backend_name() const { return backend_->name(); }
Device ProcessGroup::default_device() const { return backend_->default_device(); }

uint64_t ProcessGroup::seq() const {
  std::lock_guard lock(mutex_);
  return seq_;
}

Nanoseconds ProcessGroup::timeout_of(Nanoseconds requested) const {
  TESSEL_CHECK(requested >= Nanoseconds::zero(), InvalidArgument, "timeout {} is negative",
               requested.count());
  return requested == Nanoseconds::zero() ? options_.timeout : requested;
}

void ProcessGroup::check_tensor(const Tensor& tensor, std::string_view op,
                                std::string_view role) const {
  // Messages are formatted only on failure: this runs on every call.
  const std::string_view space = role.empty() ? "" : " ";
  TESSEL_CHECK(tensor.defined(), InvalidArgument, "group '{}': {}{}{} tensor is undefined", name(),
               op, space, role);
  TESSEL_CHECK(tensor.is_contiguous(), InvalidArgument,
               "group '{}': {}{}{} tensor {} must be contiguous", name(), op, space, role,
               tensor.str());
  backend_->check_device(tensor);
}

void ProcessGroup::check_pair(const Tensor& input, const Tensor& output,
                              std::string_view op) const {
  check_tensor(input, op, "input");
  check_tensor(output, op, "output");
  TESSEL_CHECK(input.dtype() == output.dtype(), InvalidArgument,
               "{} on group '{}': input dtype {} differs from output dtype {}", op, name(),
               dtype_name(input.dtype()), dtype_name(output.dtype()));
}

bool ProcessGroup::aborted() const { return aborted_.load(std::memory_order_acquire); }

std::string ProcessGroup::abort_reason() const {
  std::lock_guard lock(mutex_);
  return abort_reason_;
}

bool ProcessGroup::mark_aborted(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return false;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  log_warn(LogComponent::kCollectives, "aborting group '{}' (id {}): {}", name(), id(), reason);
  // Operations in flight on the device: their kernels are about to be stopped, so an end event
  // that completes from now on says nothing about the data. They stay in the list until their
  // events complete, so their tensors outlive the device's use of them.
  std::vector<std::shared_ptr<WorkState>> in_flight;
  {
    std::lock_guard lock(running_mutex_);
    in_flight.assign(in_flight_.begin(), in_flight_.end());
  }
  for (const auto& work : in_flight) {
    if (work->finished()) continue;
    const std::string what =
        fmt::format("{} ({}): group was aborted: {}", work->describe(), who_, reason);
    if (work->fail(wrap_error(ErrorKind::kCommError, what))) {
      fr::FlightRecorder::global().failed(work->record_id());
    }
  }
  return true;
}

void ProcessGroup::abort(const std::string& reason) {
  if (mark_aborted(reason)) backend_->abort(reason);
}

void ProcessGroup::abort_together(std::span<const std::shared_ptr<ProcessGroup>> groups,
                                  const std::string& reason) {
  // Step 1: every group refuses new calls and fails its work in flight.
  std::vector<ProcessGroup*> marked;
  for (const auto& group : groups) {
    if (group != nullptr && group->mark_aborted(reason)) marked.push_back(group.get());
  }
  // Step 2: the backends, each kind in one call.
  std::vector<bool> done(marked.size(), false);
  for (size_t i = 0; i < marked.size(); ++i) {
    if (done[i]) continue;
    std::vector<CommBackend*> same_kind;
    for (size_t j = i; j < marked.size(); ++j) {
      if (!done[j] && marked[j]->backend_name() == marked[i]->backend_name()) {
        same_kind.push_back(marked[j]->backend_.get());
        done[j] = true;
      }
    }
    marked[i]->backend_->abort_together(same_kind, reason);
  }
}

std::shared_ptr<WorkState> ProcessGroup::running() const {
  std::lock_guard lock(running_mutex_);
  return running_;
}

std::vector<int> ProcessGroup::missing_ranks(uint64_t seq) const {
  return backend_->missing_ranks(seq);
}

std::string ProcessGroup::describe_members(const std::vector<int>& group_ranks) const {
  std::vector<int> world;
  for (int r : group_ranks) {
    if (r < 0 || r >= size_) return fmt::format("group ranks {}", fmt::join(group_ranks, ","));
    world.push_back(global_ranks_[static_cast<size_t>(r)]);
  }
  const bool one = group_ranks.size() == 1;
  return fmt::format("world rank{} {} (group rank{} {})", one ? "" : "s", fmt::join(world, ","),
                     one ? "" : "s", fmt::join(group_ranks, ","));
}

namespace {

// A backend's message in the caller's terms. Backends name the ranks a timed-out call still
// waits for by group rank ("ranks not arrived: [1, 2]"): messages name world ranks first. And a
// backend that carries one collective with another (Gloo's all_gather and reduce_scatter run
// through its all_to_all exchange) names the one it ran: the message names the one called.
std::string in_callers_terms(const ProcessGroup& group, fr::OpType called, std::string message) {
  static constexpr std::string_view kCarrier = "all_to_all";
  if (called != fr::OpType::kAllToAll && message.rfind(kCarrier, 0) == 0 &&
      message.size() > kCarrier.size() &&
      (message[kCarrier.size()] == ' ' || message[kCarrier.size()] == ':')) {
    message = "its all_to_all exchange" + message.substr(kCarrier.size());
  }
  static constexpr std::string_view kMarker = "ranks not arrived: [";
  const size_t at = message.find(kMarker);
  if (at == std::string::npos) return message;
  const size_t open = at + kMarker.size();
  const size_t close = message.find(']', open);
  if (close == std::string::npos) return message;
  std::vector<int> ranks;
  const std::string list = message.substr(open, close - open);
  for (size_t i = 0; i < list.size();) {
    size_t used = 0;
    try {
      ranks.push_back(std::stoi(list.substr(i), &used));
    } catch (const std::exception&) {
      return message;  // not a list of numbers: leave it as the backend wrote it
    }
    i += used;
    while (i < list.size() && (list[i] == ',' || list[i] == ' ')) ++i;
  }
  if (ranks.empty()) return message;
  return message.substr(0, at) + "not arrived: " + group.describe_members(ranks) +
         message.substr(close + 1);
}

}  // namespace

std::vector<std::shared_ptr<WorkState>> ProcessGroup::poll_device_work() {
  std::vector<std::shared_ptr<WorkState>> in_flight;
  {
    std::lock_guard lock(running_mutex_);
    if (in_flight_.empty()) return {};
    in_flight.assign(in_flight_.begin(), in_flight_.end());
  }
  std::vector<std::shared_ptr<WorkState>> running;
  for (const auto& work : in_flight) {
    std::exception_ptr error;
    switch (work->poll_device(&error)) {
      case WorkState::DeviceStatus::kRunning:
        // A failed operation is still polled, until its tensors can go, but no longer timed.
        if (!work->finished()) running.push_back(work);
        break;
      case WorkState::DeviceStatus::kError:
        fail_device_work(*work, error);
        break;
      default:
        break;
    }
  }
  std::lock_guard lock(running_mutex_);
  std::erase_if(in_flight_, [](const auto& work) { return !work->device_pending(); });
  return running;
}

void ProcessGroup::fail_device_work(WorkState& work, std::exception_ptr error) {
  if (work.finished()) return;
  ErrorKind kind = ErrorKind::kCommError;
  std::string message = "the device reported an unknown error";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    kind = e.kind();
    message = e.message();
  } catch (const std::exception& e) {
    message = e.what();
  }
  const std::string what = fmt::format("{} ({}): {}", work.describe(), who_,
                                       in_callers_terms(*this, work.op(), message));
  fr::FlightRecorder::global().failed(work.record_id());
  Watchdog::global().dump(work, kind, what);
  if (!work.fail(wrap_error(kind, what))) return;
  abort(what);
  Watchdog::global().enforce(this, what);
}

namespace {
// Held from a call's sequence number to the end of its enqueue on every group whose backend
// issues_in_process_order() (NCCL), so those calls reach their transports in one process-wide
// order: the order of issue. Taken before any group's own mutex.
std::mutex& process_issue_mutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace

Work ProcessGroup::issue(Call call) {
  call.issued = SteadyClock::now();
  if (call.stream) {
    call.issued_on_stream.emplace(call.stream->device());
    call.issued_on_stream->record(*call.stream);
  }
  // Not send/recv: a ring of them over per-direction groups (each rank sends, then receives) has
  // no order that is the same on every rank, and the first call on a connection waits for the
  // peer's matching one, so each keeps to its own group's thread as before.
  const bool p2p = call.record.op == fr::OpType::kSend || call.record.op == fr::OpType::kRecv;
  const bool in_process_order = backend_->issues_in_process_order() && !p2p;
  std::unique_lock<std::mutex> order_lock;
  if (in_process_order) order_lock = std::unique_lock(process_issue_mutex());
  std::unique_lock lock(mutex_);
  TESSEL_CHECK(!aborted(), CommError, "group '{}' (id {}) was aborted: {}", name(), id(),
               abort_reason_);
  uint64_t seq = 0;
  auto& record = call.record;
  record.group_id = options_.id;
  if (record.op == fr::OpType::kSend) {
    record.p2p_seq = ++send_seq_[static_cast<size_t>(record.peer)];
    seq = record.p2p_seq;
  } else if (record.op == fr::OpType::kRecv) {
    record.p2p_seq = ++recv_seq_[static_cast<size_t>(record.peer)];
    seq = record.p2p_seq;
  } else {
    seq = ++seq_;
    record.seq = seq;
  }
  // A blocking call with nothing queued runs at once on this thread: record it as started. So
  // does every collective of a group that issues in process order: under order_lock only the
  // group's send/recv can hold the slot, and a collective issued behind those (async p2p mixed
  // with collectives on one group) waits its turn on the worker, outside the process order.
  const bool async = call.async;
  const bool run_inline = (!async || in_process_order) && worker_->try_begin_inline();
  auto& recorder = fr::FlightRecorder::global();
  const uint64_t record_id = run_inline ? recorder.record_started(record) : recorder.record(record);
  std::shared_ptr<WorkState> state;
  try {
    state = std::make_shared<WorkState>(options_.name, options_.id, record.op, seq, record_id,
                                        call.timeout, members_text_);
    if (!watched_) {
      Watchdog::global().watch(weak_from_this());
      watched_ = true;
    }
  } catch (...) {
    if (run_inline) worker_->end_inline();
    throw;
  }
  if (run_inline) {
    lock.unlock();
    execute(state, call, /*recorded_started=*/true);
    worker_->end_inline();
    if (order_lock.owns_lock()) order_lock.unlock();
  } else {
    worker_->enqueue([this, state, call = std::move(call)]() mutable {
      execute(state, call, /*recorded_started=*/false);
    });
    lock.unlock();
  }
  Work work(state);
  if (!async) work.wait();
  return work;
}

void ProcessGroup::execute(const std::shared_ptr<WorkState>& state, Call& call,
                           bool recorded_started) {
  auto& recorder = fr::FlightRecorder::global();
  const uint64_t id = state->record_id();
  // A queued operation met by the destructor after the transport failed would only wait out its
  // timeout against the same lost peer: fail it unrun.
  if (destroying_.load() && transport_failed_.load()) {
    recorder.failed(id);
    state->fail(wrap_error(ErrorKind::kCommError,
                           fmt::format("{} ({}): not run: its group was destroyed after an "
                                       "earlier operation failed in the transport",
                                       state->describe(), who_)));
    return;
  }
  if (!recorded_started) recorder.started(id);
  state->mark_started();
  // The watchdog times the operation in the slot; cleared however it ends.
  {
    std::lock_guard lock(running_mutex_);
    running_ = state;
  }
  struct ClearRunning {
    ProcessGroup& group;
    ~ClearRunning() {
      std::lock_guard lock(group.running_mutex_);
      group.running_.reset();
    }
  } clear_running{*this};
  ErrorKind kind = ErrorKind::kCommError;
  std::string message;
  try {
    if (aborted()) throw CommError(fmt::format("group was aborted: {}", abort_reason()));
    std::unique_ptr<DeviceWork> device;
    call.run(OpContext{.seq = state->seq(),
                       .timeout = call.timeout,
                       .stream = call.stream,
                       .issued_on_stream = call.issued_on_stream,
                       .device_work = &device,
                       .issued = call.issued});
    if (device == nullptr) {
      if (state->complete()) recorder.completed(id);
      return;
    }
    // Enqueued on a device stream: it completes when its end event does. In the list before the
    // abort check, so an abort either fails it there or is seen here.
    state->attach_device_work(std::move(device));
    {
      std::lock_guard lock(running_mutex_);
      in_flight_.push_back(state);
    }
    Watchdog::global().device_work_added();
    if (aborted()) throw CommError(fmt::format("group was aborted: {}", abort_reason()));
    return;
  } catch (const Error& e) {
    kind = e.kind();
    message = e.message();
  } catch (const std::exception& e) {
    message = e.what();
  }
  const std::string what = fmt::format("{} ({}): {}", state->describe(), who_,
                                       in_callers_terms(*this, state->op(), message));
  // Bad arguments are the caller's to see; transport failures are also dumped (before the
  // caller wakes) and put through the watchdog's policy.
  const bool transport = kind != ErrorKind::kInvalidArgument;
  if (transport) transport_failed_.store(true);
  if (state->finished()) return;  // the watchdog failed it first
  recorder.failed(id);
  if (transport) Watchdog::global().dump(*state, kind, what);
  if (state->fail(wrap_error(kind, what)) && transport) Watchdog::global().enforce(this, what);
}

Work ProcessGroup::all_reduce(Tensor& tensor, const AllReduceOptions& options) {
  check_tensor(tensor, "all_reduce");
  Call call;
  call.record.op = fr::OpType::kAllReduce;
  call.stream = caller_stream(tensor);
  call.record.reduce_op = options.op;
  call.record.input = call.record.output = meta_of(tensor);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, tensor, op = options.op](const OpContext& ctx) mutable {
    backend_->all_reduce(tensor, op, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::broadcast(Tensor& tensor, const BroadcastOptions& options) {
  check_tensor(tensor, "broadcast");
  TESSEL_CHECK(options.root >= 0 && options.root < size_, InvalidArgument,
               "broadcast on group '{}': root {} is not a rank of a group of size {}", name(),
               options.root, size_);
  Call call;
  call.record.op = fr::OpType::kBroadcast;
  call.stream = caller_stream(tensor);
  call.record.root = options.root;
  call.record.input = call.record.output = meta_of(tensor);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, tensor, root = options.root](const OpContext& ctx) mutable {
    backend_->broadcast(tensor, root, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::all_gather(const Tensor& input, Tensor& output,
                              const AllGatherOptions& options) {
  check_pair(input, output, "all_gather");
  std::vector<int64_t> counts = options.counts;
  if (counts.empty()) counts.assign(static_cast<size_t>(size_), input.numel());
  counts = counts_or_even(counts, 0, size_, "all_gather");
  TESSEL_CHECK(counts[static_cast<size_t>(rank_)] == input.numel(), InvalidArgument,
               "all_gather on group '{}': rank {} contributes {} elements but counts[{}] is {}",
               name(), rank_, input.numel(), rank_, counts[static_cast<size_t>(rank_)]);
  TESSEL_CHECK(output.numel() == sum_of(counts), InvalidArgument,
               "all_gather on group '{}': output has {} elements, expected {} (sum of counts)",
               name(), output.numel(), sum_of(counts));
  Call call;
  call.record.op = fr::OpType::kAllGather;
  call.stream = caller_stream(input);
  call.record.input = meta_of(input);
  call.record.output = meta_of(output);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, input, output, counts = std::move(counts)](const OpContext& ctx) mutable {
    backend_->all_gather(input, output, counts, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::reduce_scatter(const Tensor& input, Tensor& output,
                                  const ReduceScatterOptions& options) {
  check_pair(input, output, "reduce_scatter");
  std::vector<int64_t> counts =
      counts_or_even(options.counts, input.numel(), size_, "reduce_scatter");
  TESSEL_CHECK(input.numel() == sum_of(counts), InvalidArgument,
               "reduce_scatter on group '{}': input has {} elements, expected {} (sum of counts)",
               name(), input.numel(), sum_of(counts));
  TESSEL_CHECK(output.numel() == counts[static_cast<size_t>(rank_)], InvalidArgument,
               "reduce_scatter on group '{}': rank {} output has {} elements, expected {}", name(),
               rank_, output.numel(), counts[static_cast<size_t>(rank_)]);
  Call call;
  call.record.op = fr::OpType::kReduceScatter;
  call.stream = caller_stream(input);
  call.record.reduce_op = options.op;
  call.record.input = meta_of(input);
  call.record.output = meta_of(output);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, input, output, counts = std::move(counts),
              op = options.op](const OpContext& ctx) mutable {
    backend_->reduce_scatter(input, output, counts, op, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::all_to_all(const Tensor& input, Tensor& output, const AllToAllOptions& options) {
  check_pair(input, output, "all_to_all");
  auto send = counts_or_even(options.send_counts, input.numel(), size_, "all_to_all send");
  auto recv = counts_or_even(options.recv_counts, output.numel(), size_, "all_to_all recv");
  TESSEL_CHECK(sum_of(send) == input.numel() && sum_of(recv) == output.numel(), InvalidArgument,
               "all_to_all on group '{}': counts sum to {} sent / {} received but the tensors "
               "hold {} / {} elements",
               name(), sum_of(send), sum_of(recv), input.numel(), output.numel());
  Call call;
  call.record.op = fr::OpType::kAllToAll;
  call.stream = caller_stream(input);
  call.record.input = meta_of(input);
  call.record.output = meta_of(output);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, input, output, send = std::move(send),
              recv = std::move(recv)](const OpContext& ctx) mutable {
    backend_->all_to_all(input, output, send, recv, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::all_to_all(std::vector<Tensor> inputs, std::vector<Tensor> outputs,
                              const AllToAllOptions& options) {
  TESSEL_CHECK(options.send_counts.empty() && options.recv_counts.empty(), InvalidArgument,
               "all_to_all on group '{}': the list form takes its counts from the views; "
               "send_counts and recv_counts must be empty",
               name());
  TESSEL_CHECK(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
      InvalidArgument,
      "all_to_all on group '{}': {} inputs and {} outputs given, expected one per rank ({})",
      name(), inputs.size(), outputs.size(), size_);
  auto check_view = [&](const Tensor& t, std::string_view role, int j) {
    TESSEL_CHECK(t.defined(), InvalidArgument, "all_to_all on group '{}': {} {} is undefined",
                 name(), role, j);
    TESSEL_CHECK(t.dtype() == inputs[0].dtype(), InvalidArgument,
                 "all_to_all on group '{}': {} {} is {}, input 0 is {}", name(), role, j,
                 dtype_name(t.dtype()), dtype_name(inputs[0].dtype()));
    backend_->check_device(t);
  };
  int64_t sent = 0, received = 0;
  for (int j = 0; j < size_; ++j) {
    check_view(inputs[static_cast<size_t>(j)], "input", j);
    check_view(outputs[static_cast<size_t>(j)], "output", j);
    sent += inputs[static_cast<size_t>(j)].numel();
    received += outputs[static_cast<size_t>(j)].numel();
  }
  const Tensor& own_in = inputs[static_cast<size_t>(rank_)];
  const Tensor& own_out = outputs[static_cast<size_t>(rank_)];
  TESSEL_CHECK(own_in.numel() == own_out.numel(), InvalidArgument,
               "all_to_all on group '{}': rank {} sends itself {} elements but receives {}", name(),
               rank_, own_in.numel(), own_out.numel());
  Call call;
  call.record.op = fr::OpType::kAllToAll;
  call.stream = caller_stream(inputs[0]);
  call.record.input = fr::TensorMeta::make(dtype_name(inputs[0].dtype()), {sent});
  call.record.output = fr::TensorMeta::make(dtype_name(inputs[0].dtype()), {received});
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, inputs = std::move(inputs), outputs = std::move(outputs)](
                 const OpContext& ctx) { backend_->all_to_all_views(inputs, outputs, ctx); };
  return issue(std::move(call));
}

Work ProcessGroup::send(const Tensor& tensor, int peer, const SendOptions& options) {
  check_tensor(tensor, "send");
  TESSEL_CHECK(peer >= 0 && peer < size_ && peer != rank_, InvalidArgument,
               "send on group '{}' from rank {}: peer {} must be another rank in [0, {})", name(),
               rank_, peer, size_);
  Call call;
  call.record.op = fr::OpType::kSend;
  call.stream = caller_stream(tensor);
  call.record.peer = peer;
  call.record.input = meta_of(tensor);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, tensor, peer, tag = options.tag](const OpContext& ctx) {
    backend_->send(tensor, peer, tag, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::recv(Tensor& tensor, int peer, const RecvOptions& options) {
  check_tensor(tensor, "recv");
  TESSEL_CHECK(peer >= 0 && peer < size_ && peer != rank_, InvalidArgument,
               "recv on group '{}' at rank {}: peer {} must be another rank in [0, {})", name(),
               rank_, peer, size_);
  Call call;
  call.record.op = fr::OpType::kRecv;
  call.stream = caller_stream(tensor);
  call.record.peer = peer;
  call.record.output = meta_of(tensor);
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this, tensor, peer, tag = options.tag](const OpContext& ctx) mutable {
    backend_->recv(tensor, peer, tag, ctx);
  };
  return issue(std::move(call));
}

Work ProcessGroup::barrier(const BarrierOptions& options) {
  Call call;
  call.record.op = fr::OpType::kBarrier;
  call.async = options.async;
  call.timeout = timeout_of(options.timeout);
  call.run = [this](const OpContext& ctx) { backend_->barrier(ctx); };
  return issue(std::move(call));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, const SplitOptions& options) {
  TESSEL_CHECK(color >= 0 || color == kNoColor, InvalidArgument,
               "split of group '{}': color {} must be >= 0 or kNoColor ({})", name(), color,
               kNoColor);
  TESSEL_CHECK(!aborted(), CommError, "split of group '{}' (id {}): the group was aborted: {}",
               name(), id(), abort_reason());
  SplitRequest request;
  request.color = color;
  request.key = key;
  if (!options.members.empty()) {
    // The caller knows the membership: check it names this rank, then use it as it is.
    TESSEL_CHECK(color != kNoColor, InvalidArgument,
                 "split of group '{}': members given for a rank passing kNoColor", name());
    for (int r : options.members) {
      TESSEL_CHECK(r >= 0 && r < size_, InvalidArgument,
                   "split of group '{}': member {} is not a rank of a group of size {}", name(), r,
                   size_);
    }
    request.members = options.members;
    request.members_given = true;
    const auto me = std::find(request.members.begin(), request.members.end(), rank_);
    TESSEL_CHECK(me != request.members.end(), InvalidArgument,
                 "split of group '{}': rank {} is not among the members it passed", name(), rank_);
    request.new_rank = static_cast<int>(me - request.members.begin());
  } else {
    // Step 1: every rank learns every (color, key) through a recorded all_gather.
    // On the group's default device (NCCL moves device memory only).
    const Device device = default_device();
    Tensor mine = to(from_vector<int64_t>({color, key}), device);
    Tensor all = empty({2 * static_cast<int64_t>(size_)}, DType::kI64, device);
    all_gather(mine, all, {.timeout = options.timeout});
    const Tensor host = to(all, Device::cpu());
    const int64_t* pairs = host.data<int64_t>();

    // Step 2: members of my colour ordered by (key, old rank).
    if (color != kNoColor) {
      std::vector<std::pair<int64_t, int>> order;
      for (int r = 0; r < size_; ++r) {
        if (pairs[2 * r] == color) order.emplace_back(pairs[2 * r + 1], r);
      }
      std::sort(order.begin(), order.end());
      for (const auto& [k, r] : order) request.members.push_back(r);
      request.new_rank =
          static_cast<int>(std::find(request.members.begin(), request.members.end(), rank_) -
                           request.members.begin());
    }
  }
  {
    std::lock_guard lock(mutex_);
    request.split_index = split_count_++;
  }
  request.options.name = options.name.empty() ? fmt::format("{}/{}", name(), color) : options.name;
  // The requested name is part of the id, so ranks that create different groups at the same
  // point (mesh dimensions made in different orders) never join one communicator by accident.
  request.options.id = mix_id(options_.id, request.split_index, color, options.name);
  request.options.timeout = timeout_of(options.timeout);

  // Step 3: the backend builds the sub-communicator, as a recorded collective of this group (op
  // "split", text: the requested name), so a split that hangs is timed by the watchdog and shows
  // in the dumps like any other collective.
  auto made = std::make_shared<std::unique_ptr<CommBackend>>();
  Call call;
  call.record.op = fr::OpType::kSplit;
  call.record.text = options.name;
  const int64_t new_size = static_cast<int64_t>(request.members.size());
  call.record.input = call.record.output = fr::TensorMeta::make("", &new_size, 1);
  call.timeout = request.options.timeout;
  call.run = [this, request, made](const OpContext&) { *made = backend_->split(request); };
  issue(std::move(call));
  std::unique_ptr<CommBackend> sub = std::move(*made);
  if (color == kNoColor) return nullptr;
  TESSEL_CHECK(sub != nullptr, Internal, "backend {} returned no group for split color {}",
               backend_name(), color);
  std::vector<int> globals;
  for (int r : request.members) globals.push_back(global_ranks_[static_cast<size_t>(r)]);
  return std::make_shared<ProcessGroup>(std::move(sub), request.options, std::move(globals));
}

}  // namespace tessel
