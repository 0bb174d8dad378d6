#pragma once
// Helpers of the tests of calls with a device part (device_work_test.cc on a pretend device,
// nccl_backend_test.cc on GPUs): polling for a condition, a substring check, the CPU time of a
// named thread, and a hung call's synchronize() timed together with the watchdog's CPU use.

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/collectives/work.h"

namespace tessel::testing {

// Polls `condition` every millisecond for up to `limit`.
template <typename F>
bool eventually(F&& condition, Nanoseconds limit = std::chrono::seconds(5)) {
  const Deadline deadline = Deadline::after(limit);
  while (!condition()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline ::testing::AssertionResult contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// CPU time (user + system) a named thread of this process has used, from
// /proc/self/task/<tid>/stat in clock ticks (10 ms each on most kernels); null when no thread
// has that name (pthread_setname_np, 15 characters).
inline std::optional<Nanoseconds> thread_cpu_time(std::string_view name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    if (!std::getline(comm, thread_name) || thread_name != name) continue;
    std::ifstream stat_file(task.path() / "stat");
    std::string stat;
    if (!std::getline(stat_file, stat)) continue;
    // The fields after the ")" that closes the name: state is field 3, utime 14, stime 15.
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) stime = std::stoll(field);
    }
    const double tick_ns = 1e9 / static_cast<double>(sysconf(_SC_CLK_TCK));
    return Nanoseconds(static_cast<int64_t>(static_cast<double>(utime + stime) * tick_ns));
  }
  return std::nullopt;
}

// A hung call's synchronize(): how long it took to fail, the watchdog thread's CPU time meanwhile,
// and the error (empty when it did not throw Timeout).
struct HangOutcome {
  Nanoseconds hung{0};
  Nanoseconds watchdog_cpu{0};
  std::string error;
};

inline HangOutcome synchronize_hung(Work& work) {
  std::optional<Nanoseconds> before;
  EXPECT_TRUE(eventually([&] { return (before = thread_cpu_time("tessel-watchdog")).has_value(); }))
      << "no thread named tessel-watchdog";
  HangOutcome out;
  Stopwatch clock;
  try {
    work.synchronize(std::chrono::seconds(60));
    ADD_FAILURE() << "a hung call returned from synchronize()";
  } catch (const Timeout& e) {
    out.error = e.what();
  }
  out.hung = clock.elapsed();
  const std::optional<Nanoseconds> after = thread_cpu_time("tessel-watchdog");
  if (before && after) out.watchdog_cpu = *after - *before;
  return out;
}

// The watchdog sleeps between polls: over a hang of about a second, a spinning one would use
// all of it.
inline ::testing::AssertionResult watchdog_stayed_idle(const HangOutcome& h) {
  if (h.watchdog_cpu < h.hung / 10) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "watchdog CPU time " << format_duration(h.watchdog_cpu)
                                       << " over a hang of " << format_duration(h.hung);
}

}  // namespace tessel::testing
