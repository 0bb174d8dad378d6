#pragma once
// The flight recorder: a fixed-capacity ring of fixed-size entries holding the metadata of every
// collective (and user marker) this process issued, so a hang can be traced to the rank and the
// call. Recording never allocates and never blocks: a slot is claimed with one atomic increment
// and published with a per-slot sequence lock, so dumps can copy entries while ranks record.
//
//   auto& fr = FlightRecorder::global();
//   fr.register_group(7, "dp", {0, 2, 4, 6});
//   RecordArgs a{.group_id = 7, .seq = 42, .op = OpType::kAllReduce, .reduce_op = ReduceOp::kSum};
//   a.input = TensorMeta::make("f32", {1024});
//   const uint64_t id = fr.record(a);   // state: scheduled
//   fr.started(id); ... fr.completed(id);
//
// Thread-safe: any thread may record, update and snapshot concurrently.

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::fr {

enum class OpType : uint8_t {
  kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kSend, kRecv, kBarrier,
  kUserEvent,
};
enum class ReduceOp : uint8_t { kNone, kSum, kAvg, kMax, kMin, kProduct };
enum class EntryState : uint8_t { kScheduled, kStarted, kCompleted, kFailed };

std::string_view op_name(OpType op);          // "all_reduce", "send", "user_event"
std::string_view reduce_op_name(ReduceOp op);  // "none", "sum", ...
std::string_view state_name(EntryState state); // "scheduled", "started", "completed", "failed"

inline constexpr int kMaxDims = 6;

// Shape and dtype of one tensor argument, inline (no heap).
struct TensorMeta {
  char dtype[8] = {};  // "f32", "bf16", ... ("" when the op has no tensor)
  uint8_t ndim = 0;    // dimensions kept; shapes with more keep the first kMaxDims-1 and fold
  int64_t shape[kMaxDims] = {};
  int64_t numel = 0;

  static TensorMeta make(std::string_view dtype, std::initializer_list<int64_t> shape);
  static TensorMeta make(std::string_view dtype, const int64_t* shape, int ndim);
};

// What a caller knows when it issues an operation.
struct RecordArgs {
  uint64_t group_id = 0;
  uint64_t seq = 0;        // per-group collective sequence number (0 for send/recv)
  int32_t peer = -1;       // send/recv: the peer's rank in the group
  uint64_t p2p_seq = 0;    // send/recv: per-(group, peer, direction) sequence number
  OpType op = OpType::kAllReduce;
  ReduceOp reduce_op = ReduceOp::kNone;
  int32_t root = -1;       // broadcast root
  uint32_t coalesced_id = 0;     // non-zero when issued as part of a coalesced batch
  uint32_t coalesced_index = 0;
  uint32_t callsite_id = 0;      // caller-chosen id of the call site (e.g. a hash of file:line)
  TensorMeta input, output;
  std::string_view text;         // user events: the marker text (truncated to fit)
};

// One ring slot, as a snapshot sees it. Times are monotonic nanoseconds (0 = not yet).
struct Entry {
  uint64_t record_id = 0;  // per-process, from 1; not comparable across ranks
  uint64_t group_id = 0;
  uint64_t seq = 0;
  int32_t peer = -1;
  uint64_t p2p_seq = 0;
  OpType op = OpType::kAllReduce;
  ReduceOp reduce_op = ReduceOp::kNone;
  EntryState state = EntryState::kScheduled;
  int32_t root = -1;
  uint32_t coalesced_id = 0;
  uint32_t coalesced_index = 0;
  uint32_t callsite_id = 0;
  int64_t step = -1;       // training step current when recorded (set_step), -1 if never set
  TensorMeta input, output;
  int64_t enqueued_ns = 0, started_ns = 0, completed_ns = 0;
  uint32_t thread_id = 0;  // kernel thread id of the recording thread
  char text[48] = {};      // user event text
};

// A group as registered: id, name and member ranks (global ranks).
struct GroupInfo {
  uint64_t id = 0;
  std::string name;
  std::vector<int> ranks;
};

struct RecorderOptions {
  size_t capacity = 4096;  // entries kept; older ones are overwritten
};

class FlightRecorder {
 public:
  explicit FlightRecorder(RecorderOptions options = {});
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The process's recorder (capacity from TESSEL_FR_CAPACITY at first use). Never destroyed.
  static FlightRecorder& global();

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }

  // Groups are registered once, outside the hot path (may allocate, takes a lock).
  void register_group(uint64_t id, std::string name, std::vector<int> ranks);
  std::vector<GroupInfo> groups() const;

  // Records an operation as scheduled; returns its record id (0 when disabled). Lock-free,
  // no allocation.
  uint64_t record(const RecordArgs& args) noexcept;
  // Records a user marker ("step 1200 begins") as a completed user_event entry.
  uint64_t record_event(std::string_view text) noexcept;
  // State transitions; a no-op for an id whose slot has since been overwritten.
  void started(uint64_t record_id) noexcept;
  void completed(uint64_t record_id) noexcept;
  void failed(uint64_t record_id) noexcept;

  // The training step stamped on later entries.
  void set_step(int64_t step) noexcept { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const noexcept { return step_.load(std::memory_order_relaxed); }

  // Consistent copies of the live entries, oldest first. May allocate; never blocks recorders.
  std::vector<Entry> snapshot() const;
  // Number of entries ever recorded (so dropped = recorded() - capacity when larger).
  uint64_t recorded() const { return next_id_.load(std::memory_order_acquire) - 1; }

 private:
  struct Slot;
  void set_state(uint64_t record_id, EntryState state, int64_t now_ns) noexcept;

  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int64_t> step_{-1};
  std::atomic<bool> enabled_{true};
  mutable std::mutex groups_mutex_;
  std::vector<GroupInfo> groups_;
};

}  // namespace tessel::fr
