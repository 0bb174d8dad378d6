// StoreTable, the data structure behind StoreServer: when parked waiters finish, and how.
#include "tessel/store/internal/store_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "tessel/base/error.h"

namespace tessel::internal {
namespace {

using namespace std::chrono_literals;

// Records how it finished; tests wait on it with a deadline.
class RecordingWaiter final : public StoreWaiter {
 public:
  void finish(WaitEnd end, std::vector<std::string> values) override {
    std::lock_guard lock(mutex_);
    ++calls_;
    end_ = end;
    values_ = std::move(values);
    changed_.notify_all();
  }
  bool finished_within(Nanoseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return calls_ > 0; });
  }
  int calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  WaitEnd end() {
    std::lock_guard lock(mutex_);
    return end_;
  }
  std::vector<std::string> values() {
    std::lock_guard lock(mutex_);
    return values_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int calls_ = 0;
  WaitEnd end_ = WaitEnd::kStopped;
  std::vector<std::string> values_;
};

struct StartedTable {
  explicit StartedTable(StoreLimits limits = {}) : table(limits) { table.start(); }
  StoreTable table;
};

TEST(StoreTableTest, PresentKeysAnswerWithoutParking) {
  StartedTable t;
  t.table.set("a", "1");
  RecordingWaiter w;
  auto values = t.table.get_or_park({"a", "a"}, true, 1s, &w);
  ASSERT_TRUE(values.has_value());
  EXPECT_EQ(*values, (std::vector<std::string>{"1", "1"}));
  EXPECT_EQ(w.calls(), 0);
  EXPECT_EQ(t.table.stats().waiters, 0u);
}

TEST(StoreTableTest, FinishesOnlyWhenEveryKeyExistsAtOnce) {
  StartedTable t;
  RecordingWaiter w;
  ASSERT_FALSE(t.table.get_or_park({"a", "b"}, true, 60s, &w).has_value());
  t.table.set("a", "1");
  EXPECT_TRUE(t.table.delete_key("a"));
  t.table.set("b", "2");  // a is gone again: still waiting
  EXPECT_EQ(w.calls(), 0);
  EXPECT_EQ(t.table.stats().waiters, 1u);
  t.table.add("a", 7);
  ASSERT_TRUE(w.finished_within(10s));
  EXPECT_EQ(w.end(), WaitEnd::kReady);
  EXPECT_EQ(w.values(), (std::vector<std::string>{"7", "2"}));
  EXPECT_EQ(t.table.stats().waiters, 0u);
}

TEST(StoreTableTest, WaitWithoutValuesAndCompareSetWake) {
  StartedTable t;
  RecordingWaiter w;
  ASSERT_FALSE(t.table.get_or_park({"k"}, false, 60s, &w).has_value());
  EXPECT_EQ(t.table.compare_set("k", "x", "no"), "");  // no match: nothing set, no wake
  EXPECT_EQ(w.calls(), 0);
  EXPECT_EQ(t.table.compare_set("k", "", "yes"), "yes");
  ASSERT_TRUE(w.finished_within(10s));
  EXPECT_EQ(w.end(), WaitEnd::kReady);
  EXPECT_TRUE(w.values().empty());
}

TEST(StoreTableTest, MultiSetWakesEveryWaiterItCompletes) {
  StartedTable t;
  std::vector<RecordingWaiter> waiters(5);
  for (int i = 0; i < 5; ++i) {
    ASSERT_FALSE(t.table.get_or_park({fmt::format("k{}", i % 3)}, true, 60s, &waiters[i]));
  }
  t.table.multi_set({"k0", "k1"}, {"zero", "one"});
  for (int i = 0; i < 5; ++i) {
    if (i % 3 == 2) continue;
    ASSERT_TRUE(waiters[i].finished_within(10s)) << i;
    EXPECT_EQ(waiters[i].values(), (std::vector<std::string>{i % 3 == 0 ? "zero" : "one"}));
  }
  EXPECT_EQ(waiters[2].calls(), 0);
  EXPECT_EQ(t.table.stats().waiters, 1u);
}

TEST(StoreTableTest, TimeoutNamesTheMissingKeys) {
  StartedTable t;
  t.table.set("here", "");
  RecordingWaiter w;
  ASSERT_FALSE(t.table.get_or_park({"here", "gone"}, false, 20ms, &w).has_value());
  ASSERT_TRUE(w.finished_within(10s));
  EXPECT_EQ(w.end(), WaitEnd::kTimeout);
  EXPECT_EQ(w.values(), (std::vector<std::string>{"gone"}));
  EXPECT_EQ(t.table.stats().waiters, 0u);
}

TEST(StoreTableTest, ZeroTimeoutAnswersAtOnce) {
  StartedTable t;
  RecordingWaiter w;
  ASSERT_FALSE(t.table.get_or_park({"gone"}, true, 0ns, &w).has_value());
  EXPECT_EQ(w.calls(), 1);
  EXPECT_EQ(w.end(), WaitEnd::kTimeout);
}

TEST(StoreTableTest, LaterDeadlineDoesNotDelayAnEarlierOne) {
  StartedTable t;
  RecordingWaiter long_waiter, short_waiter;
  ASSERT_FALSE(t.table.get_or_park({"x"}, true, 60s, &long_waiter));
  ASSERT_FALSE(t.table.get_or_park({"y"}, true, 10ms, &short_waiter));
  ASSERT_TRUE(short_waiter.finished_within(10s));
  EXPECT_EQ(short_waiter.end(), WaitEnd::kTimeout);
  EXPECT_EQ(long_waiter.calls(), 0);
  t.table.stop();
  EXPECT_EQ(long_waiter.end(), WaitEnd::kStopped);
}

TEST(StoreTableTest, CancelUnparksOnce) {
  StartedTable t;
  RecordingWaiter w;
  ASSERT_FALSE(t.table.get_or_park({"k"}, true, 60s, &w));
  EXPECT_TRUE(t.table.cancel(&w));
  EXPECT_FALSE(t.table.cancel(&w));
  t.table.set("k", "v");
  EXPECT_EQ(w.calls(), 0);  // a cancelled waiter is never finished
}

TEST(StoreTableTest, StopFinishesParkedAndRefusesNewWaits) {
  StartedTable t;
  RecordingWaiter parked, late;
  ASSERT_FALSE(t.table.get_or_park({"k"}, true, 60s, &parked));
  t.table.stop();
  EXPECT_EQ(parked.calls(), 1);
  EXPECT_EQ(parked.end(), WaitEnd::kStopped);
  EXPECT_THROW(t.table.get_or_park({"k"}, true, 60s, &late), PeerLost);
  t.table.set("k", "v");  // non-blocking calls still work until the server shuts down
  EXPECT_EQ(*t.table.get_or_park({"k"}, true, 60s, &late), std::vector<std::string>{"v"});
}

TEST(StoreTableTest, LimitsNameThemselves) {
  StoreLimits limits;
  limits.max_waiters = 1;
  limits.max_keys = 1;
  StartedTable t(limits);
  RecordingWaiter a, b;
  ASSERT_FALSE(t.table.get_or_park({"k"}, true, 60s, &a));
  try {
    t.table.get_or_park({"k"}, true, 60s, &b);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(e.message().find("max_waiters"), std::string::npos) << e.what();
  }
  t.table.set("k", "v");
  try {
    t.table.set("second", "v");
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(e.message().find("max_keys"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::internal
