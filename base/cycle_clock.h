#pragma once
// CycleClock: the CPU's invariant time-stamp counter as a clock that costs a fraction of
// clock_gettime, for paths that stamp every event (the flight recorder). Ticks become monotonic
// nanoseconds later, by interpolating between two (tick, CLOCK_MONOTONIC_RAW) readings: an
// anchor taken before the ticks and one taken when converting. The raw clock is not slewed by
// NTP, so the interpolation is exact up to the jitter of the two readings (tens of ns).
//
//   const CycleAnchor start = CycleClock::anchor();
//   const int64_t t = CycleClock::now();          // hot path: one rdtsc
//   ...
//   const TickConverter conv(start);              // reads the clocks once
//   const int64_t ns = conv.to_monotonic_ns(t);   // the monotonic_ns() time of tick t
//
// Where the counter is not usable (no invariant TSC, the kernel does not use it as its
// clocksource, or not x86-64) callers fall back to monotonic_ns(); see usable().
// Thread-safe. now(), anchor() and TickConverter are async-signal-safe.

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace tessel {

struct CycleAnchor {
  int64_t tick = 0;
  int64_t raw_ns = 0;  // CLOCK_MONOTONIC_RAW at `tick`
};

class CycleClock {
 public:
  // True when the CPU has an invariant TSC (CPUID 0x80000007, EDX bit 8) and the kernel's
  // clocksource is "tsc" (the kernel found it synchronized across cores). Decided once per
  // process; the first call reads /sys, so make it outside signal handlers.
  static bool usable();

  // The counter. Only meaningful when usable().
  static int64_t now() noexcept {
#if defined(__x86_64__)
    return static_cast<int64_t>(__rdtsc());
#else
    return 0;
#endif
  }

  // The counter and CLOCK_MONOTONIC_RAW read together (the raw time is the midpoint of two
  // readings around the counter).
  static CycleAnchor anchor() noexcept;
};

// Converts ticks taken after `start` (and before this converter was made) to monotonic_ns().
class TickConverter {
 public:
  TickConverter() noexcept = default;  // converts nothing; to be assigned
  explicit TickConverter(CycleAnchor start) noexcept;

  // monotonic_ns() when this converter was made.
  int64_t now_ns() const noexcept { return now_mono_ns_; }
  // The monotonic_ns() time of `tick`; 0 stays 0 (a timestamp not yet taken).
  int64_t to_monotonic_ns(int64_t tick) const noexcept;

 private:
  CycleAnchor start_, now_;
  int64_t now_mono_ns_ = 0;
};

}  // namespace tessel
