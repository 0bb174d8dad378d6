#pragma once
// Watchdog: one thread per process that watches the running operation of every group (a group
// runs one operation at a time, in its execution slot, and a timeout counts from the start). It
// fails work that ran past its timeout with a Timeout naming the group, the op, the
// sequence number and (where the backend knows) the ranks that had not arrived, calls the dump
// hook (set by the flight-recorder integration), and applies the failure policy:
//
//   raise              the error is stored in the Work; wait() (or the blocking call) throws it.
//                      The group stays usable only if the backend recovers (threads, gloo: no).
//   abort_communicator as raise, and the group is aborted (ProcessGroup::abort): NCCL's
//                      ncclCommAbort, gloo/threads wake blocked calls with CommError; every later
//                      call on the group fails at once.
//   abort_process      as abort_communicator, then the process ends with std::abort() after the
//                      dump hook returned, so a launcher restarts the job (what a hung MPI call
//                      needs: MPI cannot cancel it).
//
// The policy comes from WatchdogOptions or TESSEL_WATCHDOG_POLICY. Failures a backend detects
// itself (its own Timeout, PeerLost, CommError) go through the same hook and policy.
//
// Operations in flight on a device (NCCL: enqueued on the group's communication stream, see
// ProcessGroup) are polled every WatchdogOptions::device_poll_interval, and only while there are
// any: their end events (cudaEventQuery) and the transport's asynchronous errors
// (ncclCommGetAsyncError). A completed one is completed in the Work and the flight recorder
// (completed = when the watchdog saw it, started = that minus the duration the events measured);
// one that failed or ran past its timeout is failed like any other, and its group is aborted
// whatever the policy (ncclCommAbort: nothing else stops a kernel waiting for a peer).
//
// Nothing is registered per operation, so a loop of small collectives costs the watchdog nothing
// and finished work is freed by its last handle, not retired in batches. Compute spans timed on
// a device (compute_span.h) are the one thing registered, while their end event is pending: they
// are polled with the device work and completed in the flight recorder the same way (never
// timed out: they are the caller's own kernels).
//
// Thread-safety: all methods are thread-safe. Ownership: holds weak_ptrs to the watched groups
// (dropped once a group is gone); the thread starts on first watch() and is joined by stop() /
// the destructor.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/base/mutex.h"
#include "tessel/collectives/work.h"
#include "tessel/tensor/stream.h"

namespace tessel {

class ProcessGroup;

enum class WatchdogPolicy : uint8_t { kRaise, kAbortCommunicator, kAbortProcess };
std::string_view watchdog_policy_name(WatchdogPolicy policy);  // "raise", "abort_communicator"...
// Parses a name as printed above; throws InvalidArgument listing the valid names.
WatchdogPolicy parse_watchdog_policy(std::string_view text);

struct WatchdogOptions {
  WatchdogPolicy policy = WatchdogPolicy::kRaise;
  // How often finished work is retired when nothing is about to expire.
  Nanoseconds poll_interval = std::chrono::milliseconds(200);
  // How often operations in flight on a device are polled while there are any: the delay before
  // their completion is seen (their flight-recorder durations come from the device's events).
  Nanoseconds device_poll_interval = std::chrono::milliseconds(2);
  // Extra time given to a backend to report its own (more precise) timeout before the
  // watchdog fails the work.
  Nanoseconds grace = std::chrono::milliseconds(250);
};

// What the dump hook is told.
struct WatchdogEvent {
  std::string reason;  // the error's what()
  ErrorKind kind = ErrorKind::kTimeout;
  uint64_t group_id = 0;
  std::string group_name;
  uint64_t seq = 0;
};
using WatchdogDumpHook = std::function<void(const WatchdogEvent&)>;

class Watchdog {
 public:
  explicit Watchdog(WatchdogOptions options = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The process's watchdog (policy from TESSEL_WATCHDOG_POLICY). Destroyed at exit.
  static Watchdog& global();

  void start();
  // Joins the thread; watched work is no longer enforced. Idempotent.
  void stop();

  // Watches `group`'s running operation (ProcessGroup::running()) for as long as the group
  // lives. Idempotent per group.
  void watch(std::weak_ptr<ProcessGroup> group);
  // For failures a backend detected itself, in this order: dump() (logs, calls the dump hook)
  // before the Work is failed, so the dump exists when the caller sees the error; then
  // enforce() (the policy) once the Work holds the error.
  void dump(const WorkState& work, ErrorKind kind, const std::string& what);
  void enforce(ProcessGroup* group, const std::string& what);
  // Tells the watchdog an operation went in flight on a device (ProcessGroup calls it), so it
  // starts polling now rather than at its next idle wake-up. One atomic load while it polls.
  void device_work_added();
  // Polls a compute span timed on a device (ComputeSpan) with the operations in flight on devices
  // until `end` completed, then completes flight-recorder entry `record_id`: completed = when it
  // was seen, started = that minus the device time from `begin` to `end` (both timed events of
  // one device). Starts the thread if it is not running. Non-blocking.
  void watch_span(uint64_t record_id, Event begin, Event end);

  // Replaces the dump hook (null: none). The hook runs on the watchdog thread or on the thread
  // that saw the failure, must be thread-safe and must not block for long.
  void set_dump_hook(WatchdogDumpHook hook);
  void set_policy(WatchdogPolicy policy);
  WatchdogPolicy policy() const;
  // Groups currently watched (alive at the last pass).
  size_t watched() const;

 private:
  struct DeviceSpan {
    uint64_t record_id;
    Event begin, end;
  };
  void run();
  void expire(const std::shared_ptr<WorkState>& work, ProcessGroup& group);
  // Completes the watched spans whose end event completed; true when some are still pending.
  bool poll_spans();

  mutable Mutex mutex_;
  std::condition_variable_any cv_;
  WatchdogOptions options_ TESSEL_GUARDED_BY(mutex_);
  WatchdogDumpHook dump_hook_ TESSEL_GUARDED_BY(mutex_);
  std::vector<std::weak_ptr<ProcessGroup>> groups_ TESSEL_GUARDED_BY(mutex_);
  bool stopping_ TESSEL_GUARDED_BY(mutex_) = false;
  bool wake_ TESSEL_GUARDED_BY(mutex_) = false;  // device work was added while it slept
  // Set by the watchdog's pass when it found operations in flight on a device (cleared before
  // each pass looks), so device_work_added() knows whether to wake it.
  std::atomic<bool> polling_device_{false};
  std::thread thread_ TESSEL_GUARDED_BY(mutex_);
  Mutex spans_mutex_;  // a leaf lock: nothing is called while it is held
  std::vector<DeviceSpan> spans_ TESSEL_GUARDED_BY(spans_mutex_);
};

}  // namespace tessel
