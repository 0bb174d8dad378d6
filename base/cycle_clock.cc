#include "tessel/base/cycle_clock.h"

#include <climits>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "tessel/base/clock.h"

namespace tessel {
namespace {

bool invariant_tsc() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0x80000000, nullptr) < 0x80000007) return false;
  __cpuid(0x80000007, eax, ebx, ecx, edx);
  return (edx & (1u << 8)) != 0;
#else
  return false;
#endif
}

bool kernel_clocksource_is_tsc() {
  std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(in >> name) && name == "tsc";
}

}  // namespace

bool CycleClock::usable() {
  static const bool usable = invariant_tsc() && kernel_clocksource_is_tsc();
  return usable;
}

namespace {

// The counter with CLOCK_MONOTONIC_RAW (and, when asked, CLOCK_MONOTONIC) read on either side
// of it; each clock's time is the midpoint of its two readings. The narrowest of a few brackets
// is kept: a first call may fault in the clock's page, and any may be preempted, each widening
// the uncertainty of a midpoint.
struct Reading {
  CycleAnchor anchor;
  int64_t mono_ns = 0;
};

Reading read_clocks(bool with_monotonic) noexcept {
  Reading best;
  int64_t best_width = INT64_MAX;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int64_t mono_before = with_monotonic ? monotonic_ns() : 0;
    const int64_t raw_before = monotonic_raw_ns();
    const int64_t tick = CycleClock::now();
    const int64_t raw_after = monotonic_raw_ns();
    const int64_t mono_after = with_monotonic ? monotonic_ns() : 0;
    const int64_t width = with_monotonic ? mono_after - mono_before : raw_after - raw_before;
    if (width < best_width) {
      best_width = width;
      best.anchor = CycleAnchor{tick, raw_before + (raw_after - raw_before) / 2};
      best.mono_ns = mono_before + (mono_after - mono_before) / 2;
    }
  }
  return best;
}

}  // namespace

CycleAnchor CycleClock::anchor() noexcept { return read_clocks(false).anchor; }

TickConverter::TickConverter(CycleAnchor start) noexcept : start_(start) {
  const Reading now = read_clocks(true);
  now_ = now.anchor;
  now_mono_ns_ = now.mono_ns;
}

int64_t TickConverter::to_monotonic_ns(int64_t tick) const noexcept {
  if (tick == 0) return 0;
  const int64_t span_ticks = now_.tick - start_.tick;
  int64_t raw = start_.raw_ns;
  if (span_ticks > 0) {
    const __int128 offset =
        static_cast<__int128>(tick - start_.tick) * (now_.raw_ns - start_.raw_ns) / span_ticks;
    raw += static_cast<int64_t>(offset);
  }
  // The raw clock runs at the counter's rate; the monotonic one is slewed by NTP. Measure the
  // tick's age in raw time and take it off the monotonic now.
  return now_mono_ns_ - (now_.raw_ns - raw);
}

}  // namespace tessel
