#include "tessel/flight_recorder/recorder.h"

#include <execinfo.h>
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
    case OpType::kAllReduce:
      return "all_reduce";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kAllGather:
      return "all_gather";
    case OpType::kReduceScatter:
      return "reduce_scatter";
    case OpType::kAllToAll:
      return "all_to_all";
    case OpType::kSend:
      return "send";
    case OpType::kRecv:
      return "recv";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kUserEvent:
      return "user_event";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kNone:
      return "none";
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kProduct:
      return "product";
  }
  return "unknown";
}

std::string_view state_name(EntryState state) {
  switch (state) {
    case EntryState::kScheduled:
      return "scheduled";
    case EntryState::kStarted:
      return "started";
    case EntryState::kCompleted:
      return "completed";
    case EntryState::kFailed:
      return "failed";
  }
  return "unknown";
}

TensorMeta TensorMeta::make(std::string_view dtype, std::initializer_list<int64_t> shape) {
  return make(dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorMeta TensorMeta::make(std::string_view dtype, const int64_t* shape, int ndim) {
  TensorMeta m;
  const size_t n = std::min(dtype.size(), sizeof(m.dtype) - 1);
  if (n > 0) std::memcpy(m.dtype, dtype.data(), n);
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
      if ((v & 1) == 0 && version.compare_exchange_weak(v, v + 1, std::memory_order_acquire,
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
    : capacity_(options.capacity),
      capture_stack_(options.capture_stack),
      clock_(options.clock),
      wall_clock_(options.wall_clock),
      slots_(new Slot[options.capacity == 0 ? 1 : options.capacity]),
      drops_(new DropCounter[kMaxTrackedGroups]) {
  TESSEL_CHECK(options.capacity > 0, InvalidArgument,
               "flight recorder capacity must be at least 1 entry, got 0");
  process_info_.pid = static_cast<int>(::getpid());
}

FlightRecorder::~FlightRecorder() {
  const GroupNode* n = groups_head_.load(std::memory_order_acquire);
  while (n != nullptr) {
    const GroupNode* next = n->next;
    delete n;
    n = next;
  }
}

int64_t FlightRecorder::monotonic_ns_() noexcept { return monotonic_ns(); }

int64_t FlightRecorder::wall_now_us() const noexcept {
  return wall_clock_ != nullptr ? wall_clock_() : wall_time_us();
}

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder* recorder = [] {
    const int64_t capacity = env_int(EnvKnob::kFrCapacity);
    TESSEL_CHECK(capacity > 0, InvalidArgument, "TESSEL_FR_CAPACITY={} must be positive", capacity);
    RecorderOptions options;
    options.capacity = static_cast<size_t>(capacity);
    options.capture_stack = env_bool(EnvKnob::kFrStack);
    auto* r = new FlightRecorder(options);
    r->set_enabled(env_bool(EnvKnob::kFrEnable));
    return r;
  }();
  return *recorder;
}

void FlightRecorder::set_process_info(int rank, int world_size) {
  TESSEL_CHECK(rank >= 0 && world_size > 0 && rank < world_size, InvalidArgument,
               "flight recorder process info: rank {} is not in a world of size {}", rank,
               world_size);
  process_info_.rank = rank;
  process_info_.world_size = world_size;
  process_info_.pid = static_cast<int>(::getpid());
  char host[sizeof(process_info_.hostname)] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  std::memcpy(process_info_.hostname, host, sizeof(host));
}

void FlightRecorder::register_group(uint64_t id, std::string name, std::vector<int> ranks) {
  std::lock_guard lock(groups_mutex_);
  auto* node = new GroupNode{GroupInfo{id, std::move(name), std::move(ranks)},
                             groups_head_.load(std::memory_order_relaxed)};
  groups_head_.store(node, std::memory_order_release);
}

std::vector<GroupInfo> FlightRecorder::groups() const {
  std::vector<GroupInfo> out;
  for_each_group([&](const GroupInfo& g) { out.push_back(g); });
  std::reverse(out.begin(), out.end());  // registration order
  return out;
}

void FlightRecorder::note_dropped(const Entry& old) noexcept {
  // Open addressing over a fixed table; a full table loses the count (documented limit).
  const size_t start = static_cast<size_t>(old.group_id * 0x9E3779B97F4A7C15ull >> 54);
  for (size_t probe = 0; probe < kMaxTrackedGroups; ++probe) {
    DropCounter& c = drops_[(start + probe) % kMaxTrackedGroups];
    uint8_t state = c.state.load(std::memory_order_acquire);
    if (state == 0) {
      uint8_t expected = 0;
      if (c.state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        c.group_id = old.group_id;
        c.state.store(2, std::memory_order_release);
        state = 2;
      } else {
        state = expected;
      }
    }
    while (state == 1) state = c.state.load(std::memory_order_acquire);
    if (c.group_id != old.group_id) continue;
    // The count is informational (racing overwriters may lose an increment); a plain
    // load/store keeps a locked instruction off the recording path.
    c.dropped.store(c.dropped.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const bool collective =
        old.op != OpType::kSend && old.op != OpType::kRecv && old.op != OpType::kUserEvent;
    if (collective) {
      uint64_t cur = c.last_dropped_seq.load(std::memory_order_relaxed);
      while (old.seq > cur &&
             !c.last_dropped_seq.compare_exchange_weak(cur, old.seq, std::memory_order_relaxed)) {
      }
    }
    return;
  }
}

std::vector<GroupDrops> FlightRecorder::dropped() const {
  std::vector<GroupDrops> out;
  for_each_dropped([&](const GroupDrops& d) { out.push_back(d); });
  std::sort(out.begin(), out.end(),
            [](const GroupDrops& a, const GroupDrops& b) { return a.group_id < b.group_id; });
  return out;
}

uint64_t FlightRecorder::record(const RecordArgs& args) noexcept {
  if (!enabled()) return 0;
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_acq_rel);
  Slot& slot = slots_[(id - 1) % capacity_];
  const uint64_t v = slot.lock();
  Entry& e = slot.entry;
  if (e.record_id != 0) note_dropped(e);
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
  e.enqueued_ns = now_ns();
  e.started_ns = 0;
  e.completed_ns = 0;
  e.thread_id = this_thread_id();
  const size_t n = std::min(args.text.size(), sizeof(e.text) - 1);
  if (n > 0) std::memcpy(e.text, args.text.data(), n);
  e.text[n] = '\0';
  if (capture_stack_) {
    void* frames[kMaxStackFrames + 1];
    const int depth = ::backtrace(frames, kMaxStackFrames + 1);
    // Frame 0 is record() itself.
    e.stack_depth = static_cast<uint8_t>(depth > 1 ? depth - 1 : 0);
    for (int i = 1; i < depth; ++i) e.stack[i - 1] = reinterpret_cast<uintptr_t>(frames[i]);
  } else {
    e.stack_depth = 0;
  }
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
  set_state(record_id, EntryState::kStarted, now_ns());
}
void FlightRecorder::completed(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kCompleted, now_ns());
}
void FlightRecorder::failed(uint64_t record_id) noexcept {
  set_state(record_id, EntryState::kFailed, now_ns());
}

bool FlightRecorder::read_entry(uint64_t record_id, Entry& out) const noexcept {
  if (record_id == 0) return false;
  const Slot& slot = slots_[(record_id - 1) % capacity_];
  // A writer holds a slot for a few stores; give up on it after a bounded number of tries.
  for (int attempt = 0; attempt < 10000; ++attempt) {
    const uint64_t v1 = slot.version.load(std::memory_order_acquire);
    if (v1 & 1) continue;
    std::memcpy(static_cast<void*>(&out), &slot.entry, sizeof(Entry));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.version.load(std::memory_order_relaxed) != v1) continue;
    return out.record_id == record_id;
  }
  return false;
}

std::vector<Entry> FlightRecorder::snapshot() const {
  const uint64_t newest = next_id_.load(std::memory_order_acquire) - 1;
  const uint64_t oldest = newest >= capacity_ ? newest - capacity_ + 1 : 1;
  std::vector<Entry> out;
  out.reserve(newest - oldest + 1);
  Entry copy;
  for (uint64_t id = oldest; id <= newest; ++id) {
    if (read_entry(id, copy)) out.push_back(copy);
  }
  return out;
}

}  // namespace tessel::fr
