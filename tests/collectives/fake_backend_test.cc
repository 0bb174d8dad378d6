// The fake backend: groups of 65,536 ranks are cheap; calls complete at once and are logged with
// the bytes a ring algorithm would send; with a time model each call takes latency +
// bytes / bandwidth, asleep, on the thread that runs it.

#include "tessel/collectives/fake/fake_backend.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "device_test_util.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

TEST(FakeBackendTest, LogsRingBytesAtScale) {
  auto log = std::make_shared<fake::FakeLog>();
  auto pg = fake::create_process_group(12345, 65536, log, {.name = "dp", .id = 5});
  EXPECT_EQ(pg->rank(), 12345);
  EXPECT_EQ(pg->size(), 65536);
  Tensor t = zeros({65536});
  pg->all_reduce(t);
  Tensor shard = zeros({1});
  pg->all_gather(shard, t);
  const auto calls = log->calls();
  ASSERT_EQ(calls.size(), 2u);
  const int64_t bytes = 65536 * 4;
  EXPECT_EQ(calls[0].op, fr::OpType::kAllReduce);
  EXPECT_EQ(calls[0].bytes_sent, 2 * (bytes * 65535 / 65536));
  EXPECT_EQ(calls[1].op, fr::OpType::kAllGather);
  EXPECT_EQ(calls[1].seq, 2u);
  EXPECT_EQ(calls[1].bytes_sent, bytes * 65535 / 65536);
  EXPECT_EQ(log->total_bytes_sent(), calls[0].bytes_sent + calls[1].bytes_sent);
  EXPECT_EQ(log->total_modeled(), Nanoseconds::zero());  // no time model: instant
}

TEST(FakeBackendTest, SplitIsNotImplementedWithAHint) {
  auto pg = fake::create_process_group(0, 4);
  EXPECT_THROW(pg->split(0, 0), NotImplemented);
  EXPECT_THROW(fake::create_process_group(4, 4), InvalidArgument);
}

using std::chrono::milliseconds;
using std::chrono::seconds;

Nanoseconds process_cpu_time() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return seconds(ts.tv_sec) + Nanoseconds(ts.tv_nsec);
}

TEST(FakeTimeModelTest, EachCallTakesLatencyPlusBytesOverBandwidth) {
  auto log = std::make_shared<fake::FakeLog>();
  // 2 ms per call; 1 MB/s, so each byte on the wire is 1 us.
  auto pg = fake::create_process_group(
      0, 2, {.log = log, .latency = milliseconds(2), .bytes_per_second = 1e6});
  Tensor t = zeros({1000});  // 4000 bytes; a ring all_reduce over 2 ranks sends all of them
  Stopwatch watch;
  pg->all_reduce(t);
  const Nanoseconds took = watch.elapsed();
  pg->barrier();  // no bytes: latency only
  const auto calls = log->calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].bytes_sent, 4000);
  EXPECT_EQ(calls[0].modeled, milliseconds(6));
  EXPECT_EQ(calls[1].modeled, milliseconds(2));
  EXPECT_EQ(log->total_modeled(), milliseconds(8));
  EXPECT_GE(took, milliseconds(6));  // a blocking call waits out its modeled time
}

TEST(FakeTimeModelTest, AGroupOfOnePaysOnlyTheLatency) {
  auto log = std::make_shared<fake::FakeLog>();
  auto pg = fake::create_process_group(
      0, 1, {.log = log, .latency = milliseconds(1), .bytes_per_second = 1.0});
  Tensor t = zeros({1 << 20});
  pg->all_reduce(t);  // 4 MiB at 1 byte/s would be weeks; nothing goes on the wire
  EXPECT_EQ(log->calls().at(0).modeled, milliseconds(1));
}

// The modeled wait sleeps: 300 ms of modeled time on the worker thread costs the process far
// less than 300 ms of CPU.
TEST(FakeTimeModelTest, WaitingBurnsNoCore) {
  auto pg = fake::create_process_group(0, 4, {.latency = milliseconds(300)});
  Tensor t = zeros({16});
  const Nanoseconds cpu_before = process_cpu_time();
  Stopwatch watch;
  Work w = pg->all_reduce(t, {.async = true});
  w.wait(seconds(30));
  const Nanoseconds cpu = process_cpu_time() - cpu_before;
  EXPECT_GE(watch.elapsed(), milliseconds(300));
  EXPECT_LT(cpu, milliseconds(100)) << "the modeled wait used " << cpu.count() << " ns of CPU";
}

// An async call runs on the group's worker thread: the caller gets its Work at once and is free
// until it waits; abort() wakes the sleeping call.
TEST(FakeTimeModelTest, AsyncCallsReturnAtOnceAndAbortWakesThem) {
  auto pg = fake::create_process_group(0, 2, {.latency = seconds(60)});
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t, {.async = true});
  EXPECT_FALSE(w.is_completed());
  pg->abort("test over");
  // Bounded: had abort not woken the call, this would throw Timeout instead.
  EXPECT_THROW(w.wait(seconds(10)), CommError);
}

// Async calls overlap the caller: 100 ms of modeled communication completes on the group's
// worker while the caller computes, without the caller ever waiting on it.
TEST(FakeTimeModelTest, AsyncCommunicationHidesBehindCompute) {
  auto log = std::make_shared<fake::FakeLog>();
  auto pg = fake::create_process_group(0, 2, {.log = log, .latency = milliseconds(50)});
  Tensor a = zeros({4}), b = zeros({4});
  Work wa = pg->all_reduce(a, {.async = true});
  Work wb = pg->all_reduce(b, {.async = true});  // queued behind the first: 100 ms in all
  // The caller's "compute", as long as the communication takes however loaded the machine: both
  // calls complete with no wait() from the caller.
  EXPECT_TRUE(
      testing::eventually([&] { return wa.is_completed() && wb.is_completed(); }, seconds(30)));
  EXPECT_TRUE(wa.is_success());
  EXPECT_TRUE(wb.is_success());
  EXPECT_EQ(log->total_modeled(), milliseconds(100));
}

TEST(FakeTimeModelTest, ModeledTimeBeyondTheTimeoutFailsAtTheTimeout) {
  auto pg = fake::create_process_group(0, 2, {.latency = seconds(60)});
  Tensor t = zeros({4});
  try {
    pg->all_reduce(t, {.timeout = milliseconds(20)});
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("modeled time 1m"), std::string::npos) << e.what();
  }
}

TEST(FakeTimeModelTest, SubGroupsKeepTheModel) {
  auto log = std::make_shared<fake::FakeLog>();
  auto world = fake::create_process_group(1, 4, {.log = log, .latency = milliseconds(1)});
  auto sub = world->split(0, 0, {.name = "pair", .members = {0, 1}});
  ASSERT_NE(sub, nullptr);
  sub->barrier();
  EXPECT_EQ(log->calls().back().group_id, sub->id());
  EXPECT_EQ(log->calls().back().modeled, milliseconds(1));
}

TEST(FakeTimeModelTest, BadOptionsAreRejected) {
  EXPECT_THROW(fake::create_process_group(0, 2, {.latency = milliseconds(-1)}), InvalidArgument);
  EXPECT_THROW(fake::create_process_group(0, 2, {.bytes_per_second = -1.0}), InvalidArgument);
  EXPECT_THROW(fake::create_process_group(
                   0, 2, {.bytes_per_second = std::numeric_limits<double>::quiet_NaN()}),
               InvalidArgument);
}

}  // namespace
}  // namespace tessel
