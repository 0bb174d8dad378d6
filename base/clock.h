#pragma once
// Clocks and deadlines: a monotonic clock for timeouts and durations, wall time for dumps and
// logs, and duration parsing for flags and environment knobs ("250ms", "30s", "5m").

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel {

using SteadyClock = std::chrono::steady_clock;
using Nanoseconds = std::chrono::nanoseconds;

// Monotonic nanoseconds since an arbitrary epoch (CLOCK_MONOTONIC). Cheap; never goes back.
int64_t monotonic_ns() noexcept;

// Wall-clock microseconds since the Unix epoch (CLOCK_REALTIME). For timestamps people read.
int64_t wall_time_us() noexcept;

// Nanoseconds of CLOCK_MONOTONIC_RAW: the hardware counter, not slewed by NTP.
int64_t monotonic_raw_ns() noexcept;

// A point in monotonic time after which a blocking call gives up. Copyable value type.
class Deadline {
 public:
  static Deadline after(Nanoseconds timeout) { return Deadline(SteadyClock::now() + timeout); }
  static Deadline never() { return Deadline(SteadyClock::time_point::max()); }

  bool is_never() const { return when_ == SteadyClock::time_point::max(); }
  bool expired() const { return !is_never() && SteadyClock::now() >= when_; }
  // Time left, zero once expired; Nanoseconds::max() for never().
  Nanoseconds remaining() const;
  SteadyClock::time_point when() const { return when_; }

 private:
  explicit Deadline(SteadyClock::time_point when) : when_(when) {}
  SteadyClock::time_point when_;
};

// Sleeps between polls of something that finishes elsewhere (a file, a peer, a device): `first`,
// doubling up to `most`, never past the deadline. Polling loops keep their latency low at first
// and cost almost no CPU when they wait long.
class Backoff {
 public:
  Backoff(Nanoseconds first, Nanoseconds most) : step_(first), most_(most) {}
  void pause(const Deadline& deadline);

 private:
  Nanoseconds step_;
  Nanoseconds most_;
};

// Measures elapsed monotonic time since construction or the last restart().
class Stopwatch {
 public:
  Stopwatch() : start_(SteadyClock::now()) {}
  void restart() { start_ = SteadyClock::now(); }
  Nanoseconds elapsed() const { return SteadyClock::now() - start_; }
  double elapsed_seconds() const { return std::chrono::duration<double>(elapsed()).count(); }

 private:
  SteadyClock::time_point start_;
};

// Parses "<number><unit>" with unit ns, us, ms, s, m or h ("1.5s", "250ms"); a bare number is
// seconds. Throws InvalidArgument naming the text for anything else, including negatives.
Nanoseconds parse_duration(std::string_view text);

// Short human form: "850ns", "12.5us", "250ms", "1.5s", "2m30s".
std::string format_duration(Nanoseconds d);

}  // namespace tessel
