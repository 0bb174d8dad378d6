#pragma once
// The flight recorder: a fixed-capacity ring of fixed-size entries holding the metadata of every
// collective (and user marker, and span of its own compute) this process issued, so a hang can
// be traced to the rank and the call, and a trace can show communication beside compute. Recording
// never allocates and never blocks: a slot is claimed with one atomic increment and published with
// a per-slot sequence lock, so dumps can copy entries while ranks record.
//
//   auto& fr = FlightRecorder::global();
//   fr.register_group(7, "dp", {0, 2, 4, 6});
//   RecordArgs a{.group_id = 7, .seq = 42, .op = OpType::kAllReduce, .reduce_op = ReduceOp::kSum};
//   a.input = TensorMeta::make("f32", {1024});
//   const uint64_t id = fr.record(a);   // state: scheduled
//   fr.started(id); ... fr.completed(id);
//
// Entries are stamped with recorder ticks (the CPU's time-stamp counter where usable) and read
// back in monotonic nanoseconds through a TimeBase, one per dump, so a dump's entries and its
// "now" are converted alike.
//
// Thread-safe: any thread may record, update and snapshot concurrently.

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/cycle_clock.h"
#include "tessel/base/reduce_op.h"

namespace tessel::fr {

enum class OpType : uint8_t {
  kAllReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
  kUserEvent,
  kSplit,  // creation of a sub-group: a collective of the parent group (text: the new group's name)
  kReduce,  // rooted collectives, as PyTorch dumps name them
  kGather,
  kScatter,
  kUserSpan,  // a named interval of the process's own work ("fsdp forward h.3"): begin_span
};
enum class EntryState : uint8_t { kScheduled, kStarted, kCompleted, kFailed };

std::string_view op_name(OpType op);  // "all_reduce", "send", "user_event", "split", "user_span"
// reduce_op_name(*op), or "none" for operations that reduce nothing.
std::string_view reduce_op_text(std::optional<ReduceOp> op);
std::string_view state_name(EntryState state);  // "scheduled", "started", "completed", "failed"

inline constexpr int kMaxDims = 6;
inline constexpr int kMaxStackFrames = 16;         // frames kept per entry when stacks are captured
inline constexpr size_t kMaxTrackedGroups = 1024;  // groups whose dropped entries are tracked
inline constexpr size_t kMaxPurpose = 24;  // bytes of an entry's thread purpose, NUL included

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
  uint64_t seq = 0;      // per-group collective sequence number (0 for send/recv)
  int32_t peer = -1;     // send/recv: the peer's rank in the group
  uint64_t p2p_seq = 0;  // send/recv: per-(group, peer, direction) sequence number
  OpType op = OpType::kAllReduce;
  std::optional<ReduceOp> reduce_op;
  int32_t root = -1;          // broadcast root
  uint32_t coalesced_id = 0;  // non-zero when issued as part of a coalesced batch
  uint32_t coalesced_index = 0;
  uint32_t callsite_id = 0;  // caller-chosen id of the call site (e.g. a hash of file:line)
  TensorMeta input, output;
  std::string_view text;  // user events and spans: the text (truncated to fit)
};

// One ring slot, as a snapshot sees it. Times are monotonic nanoseconds (0 = not yet).
struct Entry {
  uint64_t record_id = 0;  // per-process, from 1; not comparable across ranks
  uint64_t group_id = 0;
  uint64_t seq = 0;
  int32_t peer = -1;
  uint64_t p2p_seq = 0;
  OpType op = OpType::kAllReduce;
  std::optional<ReduceOp> reduce_op;
  EntryState state = EntryState::kScheduled;
  int32_t root = -1;
  uint32_t coalesced_id = 0;
  uint32_t coalesced_index = 0;
  uint32_t callsite_id = 0;
  // The training step (set_step) when recorded by the thread that set it; -1 when never set or
  // when another thread recorded it (a ThreadScope's own step, when it gave one).
  int64_t step = -1;
  TensorMeta input, output;
  int64_t enqueued_ns = 0, started_ns = 0, completed_ns = 0;
  uint32_t thread_id = 0;          // kernel thread id of the recording thread
  char text[48] = {};              // user event or span text
  char purpose[kMaxPurpose] = {};  // the recording thread's ThreadScope ("" outside any)
  uint8_t stack_depth = 0;         // frames in `stack` (0 unless RecorderOptions::capture_stack)
  uintptr_t stack[kMaxStackFrames] = {};  // return addresses, innermost first
};

// What the ring has overwritten for one group (entries lost to wrapping).
struct GroupDrops {
  uint64_t group_id = 0;
  uint64_t last_dropped_seq = 0;  // highest collective seq overwritten (0: none)
  uint64_t dropped = 0;           // entries of this group overwritten (approximate under races)
};

// Who this process is, for dumps. Fixed-size so a fatal-signal dump can read it.
struct ProcessInfo {
  int rank = -1;  // global rank, -1 until set_process_info
  int world_size = -1;
  int pid = 0;
  char hostname[64] = {};
  char run_id[64] = {};  // the job's run id (set_run_id), "" when unknown
};

// Ring file names (RecorderOptions::ring_file; FlightRecorder::global() under TESSEL_FR_RING_DIR):
// "tessel_fr_<run id>_rank<R>.ring" once the rank is known ("tessel_fr_rank<R>.ring" without a
// run id), "tessel_fr_<pid>.ring" before.
std::string ring_file_name(std::string_view run_id, int rank, int pid);

// Attributes what the calling thread records, while the scope lives, to the work it does for
// ("checkpoint writer", "eval"): its entries carry `purpose` (up to kMaxPurpose - 1 bytes) and
// `step` (default -1) instead of the training loop's step, and the analyzer leaves them out of
// its per-step counts and names the purpose in verdicts ("all_gather #3 of group 'dp' (checkpoint
// writer thread, no step, i64[1])"). A thread that issues collectives beside the training loop
// should open one at its top:
//
//   std::thread eval([&] {
//     tessel::fr::ThreadScope scope("eval");
//     world->all_reduce(metric);   // recorded as the "eval" thread's, with no step
//   });
//
// Scopes nest (the innermost wins; the previous one is back at destruction). Costs one 24-byte
// copy per record; no allocation. Create and destroy on one thread; not copyable.
class ThreadScope {
 public:
  explicit ThreadScope(std::string_view purpose, int64_t step = -1) noexcept;
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  char previous_purpose_[kMaxPurpose];
  int64_t previous_step_;
};
// The calling thread's purpose: its innermost ThreadScope's, "" outside any.
std::string_view thread_purpose() noexcept;

// A group as registered: id, name and member ranks (global ranks).
struct GroupInfo {
  uint64_t id = 0;
  std::string name;
  std::vector<int> ranks;
};

struct RecorderOptions {
  size_t capacity = 4096;  // entries kept; older ones are overwritten
  // Capture a call stack (backtrace(), into the entry; no heap) with every record. Costs a few
  // microseconds per record; off by default (TESSEL_FR_STACK for the global recorder).
  bool capture_stack = false;
  // Monotonic nanosecond clock for timestamps; nullptr = monotonic_ns(). Simulations and tests
  // substitute their own (the synthetic dump generator drives simulated time).
  int64_t (*clock)() noexcept = nullptr;
  // Wall-clock microseconds since the Unix epoch, written in dumps; nullptr = wall_time_us().
  int64_t (*wall_clock)() noexcept = nullptr;
  // Timestamp entries with the CPU's time-stamp counter (base/cycle_clock.h) where it is
  // usable: a third of the cost of clock_gettime. Entries read back in monotonic nanoseconds
  // either way. Ignored when `clock` is set (TESSEL_FR_TSC for the global recorder).
  bool use_cycle_clock = true;
  // When set, the ring lives in this file (created or truncated, then memory-mapped shared), so
  // its entries survive even SIGKILL; FlightRecorder::recover() reads them back. Costs nothing
  // per record. Throws IoError at construction when the file cannot be made.
  std::string ring_file = {};
};

// Turns a recorder's stored ticks into monotonic nanoseconds, as of the moment it was made.
// Async-signal-safe to make and use.
class TimeBase {
 public:
  // monotonic_ns() (or the recorder's own clock) when this time base was made.
  int64_t now_ns() const noexcept { return now_ns_; }
  // Nanoseconds of a stored tick; 0 (not yet stamped) stays 0.
  int64_t to_ns(int64_t tick) const noexcept {
    return cycles_ ? converter_.to_monotonic_ns(tick) : tick;
  }

 private:
  friend class FlightRecorder;
  explicit TimeBase(int64_t now_ns) noexcept : now_ns_(now_ns) {}
  explicit TimeBase(CycleAnchor anchor) noexcept
      : cycles_(true), converter_(anchor), now_ns_(converter_.now_ns()) {}
  bool cycles_ = false;
  TickConverter converter_;
  int64_t now_ns_ = 0;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(RecorderOptions options = {});
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The process's recorder (capacity from TESSEL_FR_CAPACITY, stacks from TESSEL_FR_STACK, a
  // ring file <TESSEL_FR_RING_DIR>/tessel_fr_<pid>.ring when that is set, renamed to
  // ring_file_name(run id, rank, pid) once set_process_info gives the rank; at first use). Never
  // destroyed.
  static FlightRecorder& global();

  // A read-only recorder over a ring file left by a process (RecorderOptions::ring_file), e.g.
  // one that was SIGKILLed: its entries, groups and process info, ready for write_dump with
  // DumpTrigger::kRecovered. Recording into it does nothing. Throws IoError when the file
  // cannot be read, InvalidArgument naming the file when it is not a ring file of this build.
  static std::unique_ptr<FlightRecorder> recover(const std::string& ring_file);

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  size_t capacity() const { return capacity_; }
  bool captures_stack() const { return capture_stack_; }
  // The recorder's clock (RecorderOptions::clock), monotonic nanoseconds.
  int64_t now_ns() const noexcept { return clock_ != nullptr ? clock_() : monotonic_ns_(); }
  // For reading entries back: now, and how stored ticks map to nanoseconds.
  TimeBase time_base() const noexcept;
  // The recorder's wall clock (RecorderOptions::wall_clock), microseconds since the epoch.
  int64_t wall_now_us() const noexcept;

  // Sets the rank and world size written in dumps; hostname and pid are filled in here.
  // Call once the process knows its rank (init of the world group). Not for the hot path.
  void set_process_info(int rank, int world_size);
  // Sets the job's run id written in dumps (sanitized by the caller: fr::sanitize_run_id;
  // truncated to 63 bytes). Call before set_process_info so a ring file is renamed once. Not
  // for the hot path.
  void set_run_id(std::string_view run_id);
  // The ring file's path ("" without one). The global recorder's name follows set_run_id and
  // set_process_info (ring_file_name); a RecorderOptions::ring_file keeps the name it was given.
  std::string ring_file() const;
  // Async-signal-safe read (plain fields written before publication).
  const ProcessInfo& process_info() const noexcept;

  // Groups are registered once, outside the hot path (may allocate, takes a lock).
  void register_group(uint64_t id, std::string name, std::vector<int> ranks);
  std::vector<GroupInfo> groups() const;
  // Calls fn(const GroupInfo&) for every registered group (newest registration of an id wins),
  // without locks or allocation: usable from a signal handler.
  template <typename Fn>
  void for_each_group(Fn&& fn) const noexcept;

  // Records an operation as scheduled; returns its record id (0 when disabled). Lock-free,
  // no allocation.
  uint64_t record(const RecordArgs& args) noexcept;
  // As record(), for an operation that starts running at once (a blocking call made on the
  // caller's thread): the entry is born started, enqueued and started at the same time.
  uint64_t record_started(const RecordArgs& args) noexcept;
  // Records a user marker ("step 1200 begins") as a completed user_event entry.
  uint64_t record_event(std::string_view text) noexcept;
  // Records the beginning of a span of the process's own work ("fsdp forward h.3") as a
  // user_span entry born started (enqueued = started = now); returns its record id (0 when
  // disabled). end_span(id) completes it now; a span timed on a device stream is completed
  // with completed(id, device_time) instead (collectives/compute_span.h does both). Costs what
  // a blocking collective's record does; spans are not operations of any group: the analyzer
  // never blames or clears a rank by them, but places a rank still inside one in that span
  // ("in compute: F mb1 s1 for 2.1s").
  uint64_t begin_span(std::string_view text) noexcept;
  void end_span(uint64_t record_id) noexcept { completed(record_id); }
  // State transitions; a no-op for an id whose slot has since been overwritten.
  void started(uint64_t record_id) noexcept;
  void completed(uint64_t record_id) noexcept;
  void failed(uint64_t record_id) noexcept;
  // completed(), for an operation that ran on a device stream: completed is now (when an observer
  // saw its end event complete, after the device by at most the observer's poll interval), and
  // started is `device_time` earlier (the duration the device measured between events around
  // it), never before the entry was enqueued.
  void completed(uint64_t record_id, Nanoseconds device_time) noexcept;

  // The training step stamped on later entries recorded by the calling thread (the training
  // loop); entries of other threads carry -1, or their ThreadScope's step, so collectives of a
  // checkpoint writer or a user thread are never counted in the loop's step.
  void set_step(int64_t step) noexcept;
  int64_t step() const noexcept;

  // Consistent copies of the live entries, oldest first. May allocate; never blocks recorders.
  std::vector<Entry> snapshot() const;
  // Number of entries ever recorded (so dropped = recorded() - capacity when larger).
  uint64_t recorded() const;
  // Copies the entry with this record id into `out`, times converted by `base`; false when it
  // was overwritten, never recorded, or stayed locked by a writer for a bounded number of
  // tries. Async-signal-safe.
  bool read_entry(uint64_t record_id, Entry& out, const TimeBase& base) const noexcept;
  bool read_entry(uint64_t record_id, Entry& out) const noexcept {
    return read_entry(record_id, out, time_base());
  }

  // Per group, what the ring overwrote (groups with no dropped entries are absent).
  std::vector<GroupDrops> dropped() const;
  // As dropped(), without allocation: calls fn(const GroupDrops&). Async-signal-safe.
  template <typename Fn>
  void for_each_dropped(Fn&& fn) const noexcept;

 private:
  struct Record;       // what a slot stores: an Entry without its stack, times in ticks
  struct StackFrames;  // one slot's captured stack
  struct Slot;
  struct Header;   // counters and process info; at the start of the ring file when there is one
  struct Storage;  // owns the header, slots and drop counters: heap memory or a file mapping
  struct GroupNode {
    GroupInfo info;
    const GroupNode* next = nullptr;
  };
  struct DropCounter {
    std::atomic<uint8_t> state{0};  // 0 empty, 1 being claimed, 2 holds group_id
    uint64_t group_id = 0;
    std::atomic<uint64_t> last_dropped_seq{0};
    std::atomic<uint64_t> dropped{0};
  };
  FlightRecorder(std::unique_ptr<Storage> storage, bool capture_stack);
  static int64_t monotonic_ns_() noexcept;
  int64_t ticks() const noexcept {
    if (clock_ != nullptr) return clock_();
    return cycles_ ? CycleClock::now() : monotonic_ns_();
  }
  size_t slot_index(uint64_t record_id) const noexcept {
    return mask_ != 0 ? (record_id - 1) & mask_ : (record_id - 1) % capacity_;
  }
  uint64_t record_(const RecordArgs& args, bool started) noexcept;
  void append_group_to_file(const GroupInfo& group);
  void name_ring_file();  // renames the ring file after the run id and rank; groups_mutex_ held
  void set_state(uint64_t record_id, EntryState state) noexcept;
  void note_dropped(const Record& old) noexcept;

  const size_t capacity_;
  const size_t mask_;  // capacity_ - 1 when a power of two (index by mask), else 0
  const bool capture_stack_;
  bool cycles_ = false;  // ticks are CycleClock counts (else nanoseconds)
  int64_t (*const clock_)() noexcept;
  int64_t (*const wall_clock_)() noexcept;
  std::unique_ptr<Storage> storage_;
  Header* header_;
  Slot* slots_;
  StackFrames* stacks_;  // null unless stacks are captured
  DropCounter* drops_;
  std::atomic<bool> enabled_{true};
  std::atomic<uint32_t> step_thread_{0};  // the kernel thread id of set_step's last caller
  // Groups form an append-only list (nodes live as long as the recorder) so a signal handler
  // can walk it; the mutex only orders writers.
  mutable std::mutex groups_mutex_;
  std::string ring_path_;   // the ring file ("" when none); guarded by groups_mutex_
  bool name_ring_ = false;  // global(): the ring file is renamed after the run id and rank
  std::atomic<const GroupNode*> groups_head_{nullptr};
};

template <typename Fn>
void FlightRecorder::for_each_group(Fn&& fn) const noexcept {
  const GroupNode* head = groups_head_.load(std::memory_order_acquire);
  for (const GroupNode* n = head; n != nullptr; n = n->next) {
    bool shadowed = false;  // a newer node registered the same id
    for (const GroupNode* m = head; m != n; m = m->next) shadowed |= (m->info.id == n->info.id);
    if (!shadowed) fn(n->info);
  }
}

template <typename Fn>
void FlightRecorder::for_each_dropped(Fn&& fn) const noexcept {
  for (size_t i = 0; i < kMaxTrackedGroups; ++i) {
    const DropCounter& c = drops_[i];
    if (c.state.load(std::memory_order_acquire) != 2) continue;
    GroupDrops d;
    d.group_id = c.group_id;
    d.last_dropped_seq = c.last_dropped_seq.load(std::memory_order_relaxed);
    d.dropped = c.dropped.load(std::memory_order_relaxed);
    if (d.dropped > 0) fn(d);
  }
}

}  // namespace tessel::fr
