#include "tessel/collectives/work.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/base/error.h"

namespace tessel {

WorkState::WorkState(std::string group_name, uint64_t group_id, fr::OpType op, uint64_t seq,
                     uint64_t record_id, Nanoseconds timeout,
                     std::shared_ptr<const std::string> members)
    : group_name_(std::move(group_name)),
      members_(std::move(members)),
      group_id_(group_id),
      op_(op),
      seq_(seq),
      record_id_(record_id),
      timeout_(timeout) {}

SteadyClock::time_point WorkState::started_at() const {
  const int64_t ns = started_ns_.load(std::memory_order_acquire);
  if (ns == INT64_MAX) return SteadyClock::time_point::max();
  return SteadyClock::time_point(
      std::chrono::duration_cast<SteadyClock::duration>(Nanoseconds(ns)));
}

std::string WorkState::describe() const {
  if (members_ == nullptr || members_->empty()) {
    return fmt::format("{} #{} on group '{}'", fr::op_name(op_), seq_, group_name_);
  }
  return fmt::format("{} #{} on group '{}' ({})", fr::op_name(op_), seq_, group_name_, *members_);
}

void WorkState::mark_started() {
  int64_t expected = INT64_MAX;
  started_ns_.compare_exchange_strong(expected, monotonic_ns(), std::memory_order_acq_rel);
}

bool WorkState::finish(std::exception_ptr error) {
  uint8_t expected = kPending;
  if (!status_.compare_exchange_strong(expected, kFinishing, std::memory_order_acq_rel)) {
    return false;
  }
  const bool failed = error != nullptr;
  error_ = std::move(error);
  // seq_cst pairs with wait_until's: either the waiter sees the status, or this sees the waiter.
  status_.store(failed ? kFailed : kCompleted, std::memory_order_seq_cst);
  notify_waiters();
  return true;
}

void WorkState::notify_waiters() const {
  if (waiters_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard lock(mutex_); }  // a waiter between its check and its wait has the mutex
    done_cv_.notify_all();
  }
}

bool WorkState::complete() { return finish(nullptr); }

bool WorkState::fail(std::exception_ptr error) {
  if (error == nullptr) error = std::make_exception_ptr(CommError("failed without an error"));
  return finish(std::move(error));
}

bool WorkState::finished() const { return status_.load(std::memory_order_acquire) >= kCompleted; }

bool WorkState::failed() const { return status_.load(std::memory_order_acquire) == kFailed; }

std::exception_ptr WorkState::error() const { return failed() ? error_ : nullptr; }

bool WorkState::wait_for(Nanoseconds timeout) const { return wait_until(timeout, false); }

bool WorkState::wait_enqueued_for(Nanoseconds timeout) const { return wait_until(timeout, true); }

bool WorkState::wait_until(Nanoseconds timeout, bool enqueued_enough) const {
  auto done = [&] {
    return status_.load(std::memory_order_seq_cst) >= kCompleted ||
           (enqueued_enough && device_state_.load(std::memory_order_seq_cst) != kNoDevice);
  };
  if (done()) return true;
  const Deadline deadline = Deadline::after(timeout);
  std::unique_lock lock(mutex_);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool ok = false;
  while (!(ok = done())) {
    if (deadline.expired()) break;
    // Bounded slices keep a very long timeout from overflowing the clock arithmetic.
    const Nanoseconds slice = std::min<Nanoseconds>(deadline.remaining(), std::chrono::hours(1));
    done_cv_.wait_for(lock, slice);
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  return ok;
}

// ---- The device part ------------------------------------------------------------------------

void WorkState::attach_device_work(std::unique_ptr<DeviceWork> device) {
  {
    std::lock_guard lock(device_mutex_);
    device_ = std::move(device);
  }
  device_state_.store(kDeviceRunning, std::memory_order_seq_cst);
  notify_waiters();
}

bool WorkState::on_device() const {
  return device_state_.load(std::memory_order_acquire) != kNoDevice;
}

bool WorkState::device_pending() const {
  return device_state_.load(std::memory_order_acquire) == kDeviceRunning;
}

bool WorkState::enqueued() const { return finished() || on_device(); }

WorkState::DeviceStatus WorkState::poll_device(std::exception_ptr* error) {
  switch (device_state_.load(std::memory_order_acquire)) {
    case kNoDevice:
      return DeviceStatus::kNone;
    case kDeviceDone:
      return DeviceStatus::kDone;
    default:
      break;
  }
  Nanoseconds device_time{0};
  {
    std::lock_guard lock(device_mutex_);
    if (device_ == nullptr) return DeviceStatus::kDone;  // another thread saw it complete
    try {
      if (!device_->query()) return DeviceStatus::kRunning;
    } catch (...) {
      if (error != nullptr) *error = std::current_exception();
      return DeviceStatus::kError;
    }
    try {
      device_time = device_->elapsed();
    } catch (const std::exception&) {
      // Only the duration is lost; the operation itself completed.
    }
    device_ns_.store(device_time.count(), std::memory_order_relaxed);
    device_.reset();  // the events and the tensors' references
    device_state_.store(kDeviceDone, std::memory_order_release);
  }
  // The observer's time is the completion time; the events give the duration.
  if (complete()) fr::FlightRecorder::global().completed(record_id_, device_time);
  return DeviceStatus::kDone;
}

void WorkState::wait_device_on_current_stream() {
  if (!device_pending()) return;
  std::lock_guard lock(device_mutex_);
  if (device_ != nullptr) device_->wait_on_current_stream();
}

Nanoseconds WorkState::device_time() const {
  return Nanoseconds(device_ns_.load(std::memory_order_relaxed));
}

bool Work::is_completed() const {
  if (state_ == nullptr || state_->finished()) return true;
  state_->poll_device();  // an error is the watchdog's to report
  return state_->finished();
}

bool Work::is_success() const {
  return state_ == nullptr || (state_->finished() && !state_->failed());
}

std::exception_ptr Work::exception() const { return state_ == nullptr ? nullptr : state_->error(); }

bool Work::wait(Nanoseconds timeout) {
  if (state_ == nullptr) return true;
  if (!state_->wait_enqueued_for(timeout)) {
    throw Timeout(fmt::format("Work::wait gave up after {} on {}; the operation is still running",
                              format_duration(timeout), state_->describe()));
  }
  if (auto error = state_->error()) std::rethrow_exception(error);
  state_->wait_device_on_current_stream();
  return true;
}

bool Work::synchronize(Nanoseconds timeout) {
  if (state_ == nullptr) return true;
  const Deadline deadline = Deadline::after(timeout);
  // The host part, then the device's end event (no stream needs to wait for a finished event).
  if (!state_->wait_enqueued_for(timeout)) {
    throw Timeout(
        fmt::format("Work::synchronize gave up after {} on {}; the operation is still running",
                    format_duration(timeout), state_->describe()));
  }
  // Poll the end event, sleeping between polls (10 us doubling up to 1 ms): a collective's
  // latency is kept, and no core spins. A device error is failed into the Work by the watchdog.
  Nanoseconds nap = std::chrono::microseconds(10);
  while (!state_->finished()) {
    state_->poll_device();
    if (state_->finished()) break;
    if (deadline.expired()) {
      throw Timeout(fmt::format(
          "Work::synchronize gave up after {} on {}; the operation is still running on the device",
          format_duration(timeout), state_->describe()));
    }
    std::this_thread::sleep_for(std::min(nap, deadline.remaining()));
    nap = std::min<Nanoseconds>(nap * 2, std::chrono::milliseconds(1));
  }
  if (auto error = state_->error()) std::rethrow_exception(error);
  return true;
}

}  // namespace tessel
