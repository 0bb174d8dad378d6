#include "tessel/collectives/work.h"

#include <fmt/format.h>

#include "tessel/base/error.h"

namespace tessel {

WorkState::WorkState(std::string group_name, uint64_t group_id, fr::OpType op, uint64_t seq,
                     uint64_t record_id, Nanoseconds timeout)
    : group_name_(std::move(group_name)),
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
  return fmt::format("{} seq {} on group '{}' (id {})", fr::op_name(op_), seq_, group_name_,
                     group_id_);
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
  // seq_cst pairs with wait_for's: either the waiter sees the status, or this sees the waiter.
  status_.store(failed ? kFailed : kCompleted, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard lock(mutex_); }  // a waiter between its check and its wait has the mutex
    done_cv_.notify_all();
  }
  return true;
}

bool WorkState::complete() { return finish(nullptr); }

bool WorkState::fail(std::exception_ptr error) {
  if (error == nullptr) error = std::make_exception_ptr(CommError("failed without an error"));
  return finish(std::move(error));
}

bool WorkState::finished() const { return status_.load(std::memory_order_acquire) >= kCompleted; }

bool WorkState::failed() const { return status_.load(std::memory_order_acquire) == kFailed; }

std::exception_ptr WorkState::error() const { return failed() ? error_ : nullptr; }

bool WorkState::wait_for(Nanoseconds timeout) const {
  if (finished()) return true;
  const Deadline deadline = Deadline::after(timeout);
  std::unique_lock lock(mutex_);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool done = false;
  while (!(done = status_.load(std::memory_order_seq_cst) >= kCompleted)) {
    if (deadline.expired()) break;
    // Bounded slices keep a very long timeout from overflowing the clock arithmetic.
    const Nanoseconds slice = std::min<Nanoseconds>(deadline.remaining(), std::chrono::hours(1));
    done_cv_.wait_for(lock, slice);
  }
  waiters_.fetch_sub(1, std::memory_order_relaxed);
  return done;
}

bool Work::is_completed() const { return state_ == nullptr || state_->finished(); }

bool Work::is_success() const {
  return state_ == nullptr || (state_->finished() && !state_->failed());
}

std::exception_ptr Work::exception() const {
  return state_ == nullptr ? nullptr : state_->error();
}

bool Work::wait(Nanoseconds timeout) {
  if (state_ == nullptr) return true;
  if (!state_->wait_for(timeout)) {
    throw Timeout(fmt::format("Work::wait gave up after {} on {}; the operation is still running",
                              format_duration(timeout), state_->describe()));
  }
  if (auto error = state_->error()) std::rethrow_exception(error);
  return true;
}

}  // namespace tessel
