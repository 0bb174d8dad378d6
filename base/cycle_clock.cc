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

CycleAnchor CycleClock::anchor() noexcept {
  // The narrowest of a few brackets: a first call may fault in the clock's page, and any may be
  // preempted, each widening the uncertainty of the midpoint.
  CycleAnchor best;
  int64_t best_width = INT64_MAX;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int64_t before = monotonic_raw_ns();
    const int64_t tick = now();
    const int64_t after = monotonic_raw_ns();
    if (after - before < best_width) {
      best_width = after - before;
      best = CycleAnchor{tick, before + (after - before) / 2};
    }
  }
  return best;
}

TickConverter::TickConverter(CycleAnchor start) noexcept : start_(start) {
  // The monotonic time of the anchor: the midpoint of readings on either side of the counter
  // (narrowest of a few tries, as in anchor()).
  int64_t best_width = INT64_MAX;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int64_t mono_before = monotonic_ns();
    const int64_t raw_before = monotonic_raw_ns();
    const int64_t tick = CycleClock::now();
    const int64_t raw_after = monotonic_raw_ns();
    const int64_t mono_after = monotonic_ns();
    if (mono_after - mono_before < best_width) {
      best_width = mono_after - mono_before;
      now_ = CycleAnchor{tick, raw_before + (raw_after - raw_before) / 2};
      now_mono_ns_ = mono_before + (mono_after - mono_before) / 2;
    }
  }
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
