#pragma once
// Work: the one asynchronous handle every ProcessGroup call returns. A Work is pending, then
// completed or failed; wait() blocks until it finishes and rethrows a stored error.
//
//   Work w = pg->all_reduce(grad, {.async = true});
//   ... overlap compute ...
//   w.wait(std::chrono::seconds(30));   // throws the collective's error, or Timeout
//
// Operations a backend enqueues on a device stream (NCCL) have a device part (DeviceWork): once
// the host part returned, the Work is "enqueued" and completes when the device part's end event
// does. For them wait() makes the caller's current stream wait for that event and returns without
// waiting for the device; synchronize() blocks the host until the device is done.
//
// Thread-safety: Work is a cheap copyable handle to shared state; every method is thread-safe.
// Ownership: the state is shared by the caller's handles, the group's worker thread, the group's
// list of operations in flight on the device, and the watchdog (the last owner frees it).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "tessel/base/clock.h"
#include "tessel/collectives/device_work.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel {

class ProcessGroup;

// The state behind a Work handle. Created by ProcessGroup; finished exactly once by whoever
// runs the operation (or by the watchdog when it times the operation out).
class WorkState {
 public:
  // `members`: the group's members as world ranks ("world ranks 0,2"), shared by the group's
  // operations; empty for work that belongs to no group.
  WorkState(std::string group_name, uint64_t group_id, fr::OpType op, uint64_t seq,
            uint64_t record_id, Nanoseconds timeout,
            std::shared_ptr<const std::string> members = nullptr);

  const std::string& group_name() const { return group_name_; }
  uint64_t group_id() const { return group_id_; }
  fr::OpType op() const { return op_; }
  uint64_t seq() const { return seq_; }
  uint64_t record_id() const { return record_id_; }
  Nanoseconds timeout() const { return timeout_; }
  // When the op started running (its timeout counts from here); time_point::max() before.
  SteadyClock::time_point started_at() const;
  // "all_reduce #42 on group 'dp' (world ranks 0,4)": the call, its group and its members.
  std::string describe() const;

  void mark_started();
  // First finisher wins; later calls are ignored and return false.
  bool complete();
  bool fail(std::exception_ptr error);

  bool finished() const;
  bool failed() const;
  std::exception_ptr error() const;
  // Waits until finished or the timeout passes; true when finished.
  bool wait_for(Nanoseconds timeout) const;

  // ---- The device part (operations a backend enqueued on a device stream) ----
  // Attaches it once the host part returned (ProcessGroup does): the Work is enqueued from now
  // on, and completes when the device part's end event does.
  void attach_device_work(std::unique_ptr<DeviceWork> device);
  // True once a device part was attached (also after it completed).
  bool on_device() const;
  // True while a device part is attached and its end event was not yet seen complete.
  bool device_pending() const;
  // True once the host part is done: finished, or a device part attached.
  bool enqueued() const;
  // Waits until enqueued or the timeout passes; true when enqueued.
  bool wait_enqueued_for(Nanoseconds timeout) const;

  enum class DeviceStatus : uint8_t { kNone, kRunning, kDone, kError };
  // Polls the device part without blocking. kDone once its end event completed: the Work is then
  // completed (unless it failed before, e.g. its group was aborted), its flight-recorder entry
  // completed with the device-measured duration, and the device part (events, tensors) freed.
  // kError when the device or the transport reported an error, stored in *error: failing the
  // Work is left to the caller (ProcessGroup, with the dump and the policy). kNone without one.
  DeviceStatus poll_device(std::exception_ptr* error = nullptr);
  // Makes the calling thread's current stream wait for the device part; nothing when there is
  // none or it completed. Never blocks the host. Throws CommError on a device API error.
  void wait_device_on_current_stream();
  // The device-measured duration of a completed device part; zero before and without one.
  Nanoseconds device_time() const;

 private:
  const std::string group_name_;
  const std::shared_ptr<const std::string> members_;
  const uint64_t group_id_;
  const fr::OpType op_;
  const uint64_t seq_;
  const uint64_t record_id_;
  const Nanoseconds timeout_;
  // kPending -> kFinishing (one finisher won) -> kCompleted or kFailed. error_ is written by
  // the finisher before kFailed is published, and never again.
  enum Status : uint8_t { kPending, kFinishing, kCompleted, kFailed };
  bool finish(std::exception_ptr error);
  // Wakes blocking waiters after a status change (they re-check their condition).
  void notify_waiters() const;
  // Waits until finished (or, with `enqueued_enough`, enqueued) or the timeout passes.
  bool wait_until(Nanoseconds timeout, bool enqueued_enough) const;
  std::atomic<uint8_t> status_{kPending};
  std::atomic<int64_t> started_ns_{INT64_MAX};
  std::exception_ptr error_;
  // Blocking waiters only: a finisher takes the mutex only when someone waits.
  mutable std::atomic<int> waiters_{0};
  mutable std::mutex mutex_;
  mutable std::condition_variable done_cv_;
  // The device part: kNoDevice -> kDeviceRunning (attached) -> kDeviceDone (end event seen,
  // device_ freed). device_mutex_ serialises the watchdog's polls with callers' waits.
  enum DeviceState : uint8_t { kNoDevice, kDeviceRunning, kDeviceDone };
  std::atomic<uint8_t> device_state_{kNoDevice};
  std::atomic<int64_t> device_ns_{0};
  std::mutex device_mutex_;
  std::unique_ptr<DeviceWork> device_;  // guarded by device_mutex_
};

class Work {
 public:
  Work() = default;  // an empty, already-completed Work
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // True once the operation finished (successfully or not); for an operation with a device part,
  // once its end event completed (polled here). Never blocks.
  bool is_completed() const;
  // True when it finished successfully.
  bool is_success() const;
  // The stored error (null while pending or on success).
  std::exception_ptr exception() const;

  // Blocks until the operation finishes, then rethrows its error if it failed. Throws Timeout
  // (naming the op, group and sequence number) when `timeout` passes first; the operation keeps
  // its own timeout and the watchdog still enforces it. Returns true on success.
  //
  // With a device part (NCCL), blocks only until the host part is done (the call is enqueued on
  // the group's communication stream), then makes the calling thread's current stream of the
  // device wait for the operation's end event and returns: later work on that stream runs after
  // the collective, and the host never waits for the device. An error the device part reports
  // later is stored in the Work (is_completed(), synchronize(), exception()).
  bool wait(Nanoseconds timeout = std::chrono::hours(24 * 365));
  // Blocks the calling thread until the operation finished, its device part included (polling
  // the end event with sleeps of at most a millisecond; never a device-wide synchronisation),
  // then rethrows its error. Throws Timeout when `timeout` passes first. Without a device part
  // the same as wait().
  bool synchronize(Nanoseconds timeout = std::chrono::hours(24 * 365));

  const std::shared_ptr<WorkState>& state() const { return state_; }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace tessel
