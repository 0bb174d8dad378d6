#pragma once
// Work: the one asynchronous handle every ProcessGroup call returns. A Work is pending, then
// completed or failed; wait() blocks until it finishes and rethrows a stored error.
//
//   Work w = pg->all_reduce(grad, {.async = true});
//   ... overlap compute ...
//   w.wait(std::chrono::seconds(30));   // throws the collective's error, or Timeout
//
// Thread-safety: Work is a cheap copyable handle to shared state; every method is thread-safe.
// Ownership: the state is shared by the caller's handles, the group's worker thread and the
// watchdog (the last owner frees it).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "tessel/base/clock.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel {

class ProcessGroup;

// The state behind a Work handle. Created by ProcessGroup; finished exactly once by whoever
// runs the operation (or by the watchdog when it times the operation out).
class WorkState {
 public:
  WorkState(std::string group_name, uint64_t group_id, fr::OpType op, uint64_t seq,
            uint64_t record_id, Nanoseconds timeout);

  const std::string& group_name() const { return group_name_; }
  uint64_t group_id() const { return group_id_; }
  fr::OpType op() const { return op_; }
  uint64_t seq() const { return seq_; }
  uint64_t record_id() const { return record_id_; }
  Nanoseconds timeout() const { return timeout_; }
  // When the op started running (its timeout counts from here); time_point::max() before.
  SteadyClock::time_point started_at() const;
  // "all_reduce seq 42 on group 'dp' (id 7)".
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

 private:
  const std::string group_name_;
  const uint64_t group_id_;
  const fr::OpType op_;
  const uint64_t seq_;
  const uint64_t record_id_;
  const Nanoseconds timeout_;
  // kPending -> kFinishing (one finisher won) -> kCompleted or kFailed. error_ is written by
  // the finisher before kFailed is published, and never again.
  enum Status : uint8_t { kPending, kFinishing, kCompleted, kFailed };
  bool finish(std::exception_ptr error);
  std::atomic<uint8_t> status_{kPending};
  std::atomic<int64_t> started_ns_{INT64_MAX};
  std::exception_ptr error_;
  // Blocking waiters only: a finisher takes the mutex only when someone waits.
  mutable std::atomic<int> waiters_{0};
  mutable std::mutex mutex_;
  mutable std::condition_variable done_cv_;
};

class Work {
 public:
  Work() = default;  // an empty, already-completed Work
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // True once the operation finished (successfully or not). Never blocks.
  bool is_completed() const;
  // True when it finished successfully.
  bool is_success() const;
  // The stored error (null while pending or on success).
  std::exception_ptr exception() const;

  // Blocks until the operation finishes, then rethrows its error if it failed. Throws Timeout
  // (naming the op, group and sequence number) when `timeout` passes first; the operation keeps
  // its own timeout and the watchdog still enforces it. Returns true on success.
  bool wait(Nanoseconds timeout = std::chrono::hours(24 * 365));

  const std::shared_ptr<WorkState>& state() const { return state_; }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace tessel
