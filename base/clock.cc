#include "tessel/base/clock.h"

#include <time.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <thread>

#include "tessel/base/error.h"

namespace tessel {

int64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t monotonic_raw_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

int64_t wall_time_us() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1'000'000 + ts.tv_nsec / 1000;
}

Nanoseconds Deadline::remaining() const {
  if (is_never()) return Nanoseconds::max();
  const auto left = when_ - SteadyClock::now();
  return left > Nanoseconds::zero() ? std::chrono::duration_cast<Nanoseconds>(left)
                                    : Nanoseconds::zero();
}

void Backoff::pause(const Deadline& deadline) {
  std::this_thread::sleep_for(std::min(step_, deadline.remaining()));
  step_ = std::min(step_ * 2, most_);
}

Nanoseconds parse_duration(std::string_view text) {
  const std::string_view original = text;
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TESSEL_CHECK(ec == std::errc() && std::isfinite(value) && value >= 0, InvalidArgument,
               "duration '{}' is not a non-negative number with an optional unit "
               "(ns, us, ms, s, m, h), e.g. '30s' or '250ms'",
               original);
  const std::string_view unit(end, text.data() + text.size() - end);
  double scale = 0;
  if (unit.empty() || unit == "s")
    scale = 1e9;
  else if (unit == "ms")
    scale = 1e6;
  else if (unit == "us")
    scale = 1e3;
  else if (unit == "ns")
    scale = 1;
  else if (unit == "m" || unit == "min")
    scale = 60e9;
  else if (unit == "h")
    scale = 3600e9;
  TESSEL_CHECK(scale != 0, InvalidArgument,
               "duration '{}' has unknown unit '{}'; expected ns, us, ms, s, m or h", original,
               unit);
  const double ns = value * scale;
  TESSEL_CHECK(ns < 9.2e18, InvalidArgument, "duration '{}' is too long", original);
  return Nanoseconds(static_cast<int64_t>(std::llround(ns)));
}

std::string format_duration(Nanoseconds d) {
  const int64_t ns = d.count();
  const int64_t abs_ns = ns < 0 ? -ns : ns;
  if (abs_ns < 1'000) return fmt::format("{}ns", ns);
  if (abs_ns < 1'000'000) return fmt::format("{:.3g}us", ns / 1e3);
  if (abs_ns < 1'000'000'000) return fmt::format("{:.3g}ms", ns / 1e6);
  if (abs_ns < 60'000'000'000) return fmt::format("{:.3g}s", ns / 1e9);
  const int64_t total_s = ns / 1'000'000'000;
  return fmt::format("{}m{}s", total_s / 60, total_s % 60);
}

}  // namespace tessel
