#include "tessel/base/clock.h"

#include <gtest/gtest.h>

#include <vector>

#include "tessel/base/cycle_clock.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

using namespace std::chrono_literals;

TEST(ClockTest, ParseDurationUnits) {
  EXPECT_EQ(parse_duration("30s"), 30s);
  EXPECT_EQ(parse_duration("30"), 30s);
  EXPECT_EQ(parse_duration("250ms"), 250ms);
  EXPECT_EQ(parse_duration("1.5s"), 1500ms);
  EXPECT_EQ(parse_duration("100us"), 100us);
  EXPECT_EQ(parse_duration("7ns"), 7ns);
  EXPECT_EQ(parse_duration("2m"), 120s);
  EXPECT_EQ(parse_duration("1h"), 3600s);
  EXPECT_EQ(parse_duration(" 0 "), 0s);
}

TEST(ClockTest, ParseDurationRejectsGarbageWithTheText) {
  for (const char* bad : {"", "abc", "-1s", "5parsecs", "s", "1e400"}) {
    try {
      parse_duration(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ClockTest, FormatDuration) {
  EXPECT_EQ(format_duration(850ns), "850ns");
  EXPECT_EQ(format_duration(12500ns), "12.5us");
  EXPECT_EQ(format_duration(250ms), "250ms");
  EXPECT_EQ(format_duration(1500ms), "1.5s");
  EXPECT_EQ(format_duration(150s), "2m30s");
}

TEST(ClockTest, DeadlineArithmetic) {
  const Deadline never = Deadline::never();
  EXPECT_TRUE(never.is_never());
  EXPECT_FALSE(never.expired());
  EXPECT_EQ(never.remaining(), Nanoseconds::max());

  const Deadline past = Deadline::after(-1s);
  EXPECT_TRUE(past.expired());
  EXPECT_EQ(past.remaining(), Nanoseconds::zero());

  const Deadline later = Deadline::after(1h);
  EXPECT_FALSE(later.expired());
  EXPECT_GT(later.remaining(), 59min);
  EXPECT_LE(later.remaining(), 1h);
}

TEST(ClockTest, MonotonicClockDoesNotGoBack) {
  int64_t last = monotonic_ns();
  for (int i = 0; i < 1000; ++i) {
    const int64_t now = monotonic_ns();
    ASSERT_GE(now, last);
    last = now;
  }
  // Wall time is after 2020-01-01 on any machine that runs this.
  EXPECT_GT(wall_time_us(), int64_t{1'577'836'800} * 1'000'000);
}

// Busy-waits (no sleep: the point is to let the counter run) for `ns` of monotonic time.
void spin_for(int64_t ns) {
  const int64_t until = monotonic_ns() + ns;
  while (monotonic_ns() < until) {
  }
}

TEST(CycleClockTest, ConvertedTicksLandBetweenMonotonicReadings) {
  if (!CycleClock::usable()) GTEST_SKIP() << "no invariant TSC used by the kernel here";
  const CycleAnchor start = CycleClock::anchor();
  struct Sample {
    int64_t before, tick, after;
  };
  std::vector<Sample> samples;
  for (int i = 0; i < 50; ++i) {
    Sample s;
    s.before = monotonic_ns();
    s.tick = CycleClock::now();
    s.after = monotonic_ns();
    samples.push_back(s);
    spin_for(20'000);
  }
  // Two converters made at different times agree, and both put each tick inside its bracket
  // (give or take the readings' own jitter).
  const TickConverter first(start);
  spin_for(2'000'000);
  const TickConverter second(start);
  EXPECT_EQ(first.to_monotonic_ns(0), 0);
  EXPECT_GT(second.now_ns(), first.now_ns());
  constexpr int64_t kSlackNs = 2'000;
  for (const Sample& s : samples) {
    const int64_t a = first.to_monotonic_ns(s.tick), b = second.to_monotonic_ns(s.tick);
    EXPECT_GE(a, s.before - kSlackNs);
    EXPECT_LE(a, s.after + kSlackNs);
    EXPECT_NEAR(a, b, kSlackNs);
  }
  // Later ticks convert to later times.
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_GT(second.to_monotonic_ns(samples[i].tick), second.to_monotonic_ns(samples[i - 1].tick));
  }
}

}  // namespace
}  // namespace tessel
