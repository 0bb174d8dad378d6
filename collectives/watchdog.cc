#include "tessel/collectives/watchdog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>

#include "tessel/base/env.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/process_group.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel {

std::string_view watchdog_policy_name(WatchdogPolicy policy) {
  switch (policy) {
    case WatchdogPolicy::kRaise:
      return "raise";
    case WatchdogPolicy::kAbortCommunicator:
      return "abort_communicator";
    case WatchdogPolicy::kAbortProcess:
      return "abort_process";
  }
  return "unknown";
}

WatchdogPolicy parse_watchdog_policy(std::string_view text) {
  for (auto p : {WatchdogPolicy::kRaise, WatchdogPolicy::kAbortCommunicator,
                 WatchdogPolicy::kAbortProcess}) {
    if (text == watchdog_policy_name(p)) return p;
  }
  throw InvalidArgument(fmt::format(
      "watchdog policy '{}' is not one of raise, abort_communicator, abort_process", text));
}

Watchdog::Watchdog(WatchdogOptions options) : options_(options) {}

Watchdog::~Watchdog() { stop(); }

Watchdog& Watchdog::global() {
  static Watchdog watchdog([] {
    WatchdogOptions options;
    options.policy = parse_watchdog_policy(env_string(EnvKnob::kWatchdogPolicy));
    return options;
  }());
  return watchdog;
}

void Watchdog::start() {
  MutexLock lock(mutex_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void Watchdog::stop() {
  std::thread thread;
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  cv_.notify_all();
  if (thread.joinable()) thread.join();
}

void Watchdog::watch(std::weak_ptr<ProcessGroup> group) {
  MutexLock lock(mutex_);
  for (const auto& g : groups_) {
    if (!g.owner_before(group) && !group.owner_before(g)) return;  // the same group
  }
  groups_.push_back(std::move(group));
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
}

void Watchdog::set_dump_hook(WatchdogDumpHook hook) {
  MutexLock lock(mutex_);
  dump_hook_ = std::move(hook);
}

void Watchdog::set_policy(WatchdogPolicy policy) {
  MutexLock lock(mutex_);
  options_.policy = policy;
}

WatchdogPolicy Watchdog::policy() const {
  MutexLock lock(mutex_);
  return options_.policy;
}

size_t Watchdog::watched() const {
  MutexLock lock(mutex_);
  return groups_.size();
}

void Watchdog::dump(const WorkState& work, ErrorKind kind, const std::string& what) {
  log_error(LogComponent::kCollectives, "{}", what);
  WatchdogDumpHook hook;
  {
    MutexLock lock(mutex_);
    hook = dump_hook_;
  }
  if (!hook) return;
  try {
    hook(WatchdogEvent{.reason = what,
                       .kind = kind,
                       .group_id = work.group_id(),
                       .group_name = work.group_name(),
                       .seq = work.seq()});
  } catch (const std::exception& e) {
    log_error(LogComponent::kCollectives, "watchdog dump hook failed: {}", e.what());
  }
}

void Watchdog::enforce(ProcessGroup* group, const std::string& what) {
  const WatchdogPolicy policy = this->policy();
  if (policy == WatchdogPolicy::kRaise) return;
  if (group != nullptr) group->abort(what);
  if (policy == WatchdogPolicy::kAbortProcess) {
    log_error(LogComponent::kCollectives,
              "watchdog policy abort_process: ending the process after: {}", what);
    std::abort();  // the documented policy: a launcher restarts the job
  }
}

void Watchdog::device_work_added() {
  if (polling_device_.load(std::memory_order_seq_cst)) return;
  {
    MutexLock lock(mutex_);
    wake_ = true;
  }
  cv_.notify_all();
}

void Watchdog::watch_span(uint64_t record_id, Event begin, Event end) {
  {
    MutexLock lock(spans_mutex_);
    spans_.push_back({record_id, std::move(begin), std::move(end)});
  }
  {
    MutexLock lock(mutex_);
    if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
  }
  device_work_added();
}

bool Watchdog::poll_spans() {
  std::vector<DeviceSpan> spans;
  {
    MutexLock lock(spans_mutex_);
    spans.swap(spans_);
  }
  if (spans.empty()) return false;
  auto& recorder = fr::FlightRecorder::global();
  std::vector<DeviceSpan> pending;
  for (DeviceSpan& span : spans) {
    // Not query(): errors that kernels recorded on the device are the issuing thread's to see.
    try {
      if (!span.end.query_completion()) {
        pending.push_back(std::move(span));
        continue;
      }
    } catch (const std::exception& e) {
      // The device itself failed (its work and collectives report it): the span ends failed.
      log_warn(LogComponent::kCollectives, "compute span {}: {}", span.record_id, e.what());
      recorder.failed(span.record_id);
      continue;
    }
    // The observer's time is the completion time; the events give the duration.
    try {
      recorder.completed(span.record_id, span.begin.elapsed(span.end));
    } catch (const std::exception&) {
      recorder.completed(span.record_id);  // only the device's duration is lost
    }
  }
  if (pending.empty()) return false;
  MutexLock lock(spans_mutex_);
  spans_.insert(spans_.begin(), std::make_move_iterator(pending.begin()),
                std::make_move_iterator(pending.end()));
  return true;
}

void Watchdog::expire(const std::shared_ptr<WorkState>& state, ProcessGroup& group) {
  WorkState& work = *state;
  if (work.finished()) return;
  std::string missing;
  const auto ranks = group.missing_ranks(work.seq());
  if (!ranks.empty()) missing = "; not arrived: " + group.describe_members(ranks);
  const std::string what = fmt::format("{} did not complete within its timeout of {} (watchdog){}",
                                       work.describe(), format_duration(work.timeout()), missing);
  // Record, dump, then wake the caller, then apply the policy (an abort may make the blocked
  // backend call return, which must find the Work already failed with this Timeout).
  fr::FlightRecorder::global().failed(work.record_id());
  dump(work, ErrorKind::kTimeout, "Timeout: " + what);
  if (!work.fail(std::make_exception_ptr(Timeout(what)))) return;
  // A device operation's kernels keep waiting for their peers until the communicator is aborted.
  if (work.on_device()) group.abort("Timeout: " + what);
  enforce(&group, "Timeout: " + what);
}

void Watchdog::run() {
  pthread_setname_np(pthread_self(), "tessel-watchdog");
  MutexLock lock(mutex_);
  while (!stopping_) {
    const WatchdogOptions options = options_;
    // The live groups (gone ones are dropped), released after the lock: dropping the last
    // reference runs a group's destructor.
    std::vector<std::shared_ptr<ProcessGroup>> held;
    std::erase_if(groups_, [&](const std::weak_ptr<ProcessGroup>& weak) {
      auto group = weak.lock();
      if (!group) return true;
      held.push_back(std::move(group));
      return false;
    });
    wake_ = false;
    lock.unlock();
    // Cleared before the groups are looked at: work added after this point either is seen by
    // this pass or finds the flag clear and wakes the next one (device_work_added).
    polling_device_.store(false, std::memory_order_seq_cst);
    // Each group's running operation and its operations in flight on the device: expired ones
    // are failed, the earliest deadline of the others sets the next wake-up.
    const auto now = SteadyClock::now();
    auto next_wake = now + options.poll_interval;
    std::vector<std::pair<std::shared_ptr<WorkState>, std::shared_ptr<ProcessGroup>>> expired;
    auto check = [&](std::shared_ptr<WorkState> work, const std::shared_ptr<ProcessGroup>& group) {
      if (!work || work->finished()) return;
      const auto started = work->started_at();
      if (started == SteadyClock::time_point::max()) return;
      const auto due = started + work->timeout() + options.grace;
      if (due <= now) {
        expired.emplace_back(std::move(work), group);
      } else {
        next_wake = std::min(next_wake, due);
      }
    };
    bool on_device = false;
    for (const auto& group : held) {
      check(group->running(), group);
      for (auto& work : group->poll_device_work()) {
        on_device = true;
        check(std::move(work), group);
      }
    }
    on_device = poll_spans() || on_device;
    if (on_device) {
      polling_device_.store(true, std::memory_order_seq_cst);
      next_wake = std::min(next_wake, now + options.device_poll_interval);
    }
    for (const auto& [work, group] : expired) expire(work, *group);
    const bool any_expired = !expired.empty();
    expired.clear();
    held.clear();
    lock.lock();
    if (any_expired) continue;
    cv_.wait_until(lock, next_wake, [&]() TESSEL_REQUIRES(mutex_) { return stopping_ || wake_; });
  }
}

}  // namespace tessel
