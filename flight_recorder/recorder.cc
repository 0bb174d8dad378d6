#include "tessel/flight_recorder/recorder.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"

namespace tessel::fr {

std::string_view op_name(OpType op) {
  switch (op) {
    case OpType::kAllReduce: return "all_reduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllGather: return "all_gather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kAllToAll: return "all_to_all";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kBarrier: return "barrier";
    case OpType::kUserEvent: return "user_event";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kNone: return "none";
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

std::string_view state_name(EntryState state) {
  switch (state) {
    case EntryState::kScheduled: return "scheduled";
    case EntryState::kStarted: return "started";
    case EntryState::kCompleted: return "completed";
    case EntryState::kFailed: return "failed";
  }
  return "unknown";
}

TensorMeta TensorMeta::make(std::string_view dtype, std::initializer_list<int64_t> shape) {
  return make(dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorMeta TensorMeta::make(std::string_view dtype, const int64_t* shape, int ndim) {
  TensorMeta m;
  const size_t n = std::min(dtype.size(), sizeof(m.dtype) - 1);
  std::memcpy(m.dtype, dtype.data(), n);
  m.numel = 1;
  for (int i = 0; i < ndim; ++i) m.numel *= shape[i];
  // Keep the leading dims; fold any beyond kMaxDims into the last kept one.
  m.ndim = static_cast<uint8_t>(std::min(ndim, kMaxDims));
  for (int i = 0; i < m.ndim; ++i) m.shape[i] = shape[i];
  for (int i = kMaxDims; i < ndim; ++i) m.shape[kMaxDims - 1] *= shape[i];
  return m;
}

namespace {

uint32_t this_thread_id() noexcept {
  thread_local const uint32_t tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  return tid;
}

}  // namespace

// A slot is guarded by a sequence number: even = stable, odd = a writer holds it. Writers take
// it with a compare-exchange (held for a few stores, so contention is a brief spin at most);
// readers copy and retry when the number moved.
struct FlightRecorder::Slot {
  std::atomic<uint64_t> version{0};
  Entry entry;

  uint64_t lock() noexcept {
    uint64_t v = version.load(std::memory_order_relaxed);
    for (;;) {
      if ((v & 1) == 0 &&
          version.compare_exchange_weak(v, v + 1, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
        std::atomic_thread_fence(std::memory_order_release);
        return v;
      }
      v = version.load(std::memory_order_relaxed);
    }
  }
  void unlock(uint64_t v) noexcept { version.store(v + 2, std::memory_order_release); }
};

FlightRecorder::FlightRecorder(RecorderOptions options)
    : capacity_(options.capacity), slots_(new Slot[options.capacity == 0 ? 1 : options.capacity]) {
  TESSEL_CHECK(options.capacity > 0, InvalidArgument,
               "flight recorder capacity must be at least 1 entry, got 0");
}

FlightRecorder::~FlightRecorder() = default;

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder* recorder = [] {
    const int64_t capacity = env_int(EnvKnob::kFrCapacity);
    TESSEL_CHECK(capacity > 0, InvalidArgument, "TESSEL_FR_CAPACITY={} must be positive",
                 capacity);
    auto* r = new FlightRecorder(RecorderOptions{static_cast<size_t>(capacity)});
    r->set_enabled(env_bool(EnvKnob::kFrEnable));
    return r;
  }();
  return *recorder;
}

void FlightRecorder::register_group(uint64_t id, std::string name, std::vector<int> ranks) {
  std::lock_guard lock(groups_mutex_);
  for (auto& g : groups_) {
    if (g.id == id) {
      g.name = std::move(name);
      g.ranks = std::move(ranks);
      return;
    }
  }
  groups_.push_back(GroupInfo{id, std::move(name), std::move(ranks)});
}

std::vector<GroupInfo> FlightRecorder::groups() const {
  std::lock_guard lock(groups_mutex_);
  return groups_;
}

uint64_t FlightRecorder::record(const RecordArgs& args) noexcept {
  if (!enabled()) return 0;
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_acq_rel);
  Slot& slot = slots_[(id - 1) % capacity_];
  const uint64_t v = slot.lock();
  Entry& e = slot.entry;
  e.record_id = id;
  e.group_id = args.group_id;
  e.seq = args.seq;
  e.peer = args.peer;
  e.p2p_seq = args.p2p_seq;
  e.op = args.op;
  e.reduce_op = args.reduce_op;
  e.state = EntryState::kScheduled;
  e.root = args.root;
  e.coalesced_id = args.coalesced_id;
  e.coalesced_index = args.coalesced_index;
  e.callsite_id = args.callsite_id;
  e.step = step();
  e.input = args.input;
  e.output = args.output;
  e.enqueued_ns = monotonic_ns();
  e.started_ns = 0;
  e.completed_ns = 0;
  e.thread_id = this_thread_id();
  const size_t n = std::min(args.text.size(), sizeof(e.text) - 1);
  std::memcpy(e.text, args.text.data(), n);
  e.text[n] = '\0';
  slot.unlock(v);
  return id;
}

uint64_t FlightRecorder::record_event(std::string_view text) noexcept {
  RecordArgs args;
  args.op = OpType::kUserEvent;
  args.text = text;
  const uint64_t id = record(args);
  completed(id);
  return id;
}

void FlightRecorder::set_state(uint64_t record_id, EntryState state, int64_t now_ns) noexcept {
  if (record_id == 0) return;
  Slot& slot = slots_[(record_id - 1) % capacity_];
  const uint64_t v = slot.lock();
  Entry& e = slot.entry;
  if (e.record_id == record_id) {
    e.state = state;
    if (state == EntryState::kStarted) {
      e.started_ns = now_ns;
    } else {
      if (e.started_ns == 0) e.started_ns = now_ns;
      e.completed_ns = now_ns;
    }
  }
  slot.unlock(v);
}

void FlightRecorder::started(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kStarted, monotonic_ns());
}
void FlightRecorder::completed(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kCompleted, monotonic_ns());
}
void FlightRecorder::failed(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kFailed, monotonic_ns());
}

std::vector<Entry> FlightRecorder::snapshot() const {
  const uint64_t newest = next_id_.load(std::memory_order_acquire) - 1;
  const uint64_t oldest = newest >= capacity_ ? newest - capacity_ + 1 : 1;
  std::vector<Entry> out;
  out.reserve(newest - oldest + 1);
  for (uint64_t id = oldest; id <= newest; ++id) {
    const Slot& slot = slots_[(id - 1) % capacity_];
    // A writer holds a slot for a few stores; give up on it after a bounded number of tries.
    for (int attempt = 0; attempt < 10000; ++attempt) {
      const uint64_t v1 = slot.version.load(std::memory_order_acquire);
      if (v1 & 1) continue;
      Entry copy = slot.entry;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.version.load(std::memory_order_relaxed) != v1) continue;
      if (copy.record_id == id) out.push_back(copy);
      break;
    }
  }
  return out;
}

}  // namespace tessel::fr
