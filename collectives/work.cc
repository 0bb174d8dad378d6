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
  std::lock_guard lock(mutex_);
  return started_at_;
}

std::string WorkState::describe() const {
  return fmt::format("{} seq {} on group '{}' (id {})", fr::op_name(op_), seq_, group_name_,
                     group_id_);
}

void WorkState::mark_started() {
  std::lock_guard lock(mutex_);
  if (started_at_ == SteadyClock::time_point::max()) started_at_ = SteadyClock::now();
}

bool WorkState::complete() {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    finished_ = true;
  }
  done_cv_.notify_all();
  return true;
}

bool WorkState::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (finished_) return false;
    finished_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
  return true;
}

bool WorkState::finished() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

bool WorkState::failed() const {
  std::lock_guard lock(mutex_);
  return finished_ && error_ != nullptr;
}

std::exception_ptr WorkState::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

bool WorkState::wait_for(Nanoseconds timeout) const {
  const Deadline deadline = Deadline::after(timeout);
  std::unique_lock lock(mutex_);
  while (!finished_) {
    if (deadline.expired()) return false;
    // Bounded slices keep a very long timeout from overflowing the clock arithmetic.
    const Nanoseconds slice = std::min<Nanoseconds>(deadline.remaining(), std::chrono::hours(1));
    done_cv_.wait_for(lock, slice);
  }
  return true;
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
