#include "tessel/flight_recorder/recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/cycle_clock.h"
#include "tessel/base/error.h"

namespace tessel::fr {
namespace {

RecordArgs all_reduce(uint64_t group, uint64_t seq) {
  RecordArgs a;
  a.group_id = group;
  a.seq = seq;
  a.op = OpType::kAllReduce;
  a.reduce_op = ReduceOp::kSum;
  a.input = TensorMeta::make("f32", {4, 256});
  a.output = a.input;
  return a;
}

TEST(RecorderTest, RecordsLifecycle) {
  FlightRecorder fr(RecorderOptions{16});
  fr.register_group(3, "dp", {0, 1});
  fr.set_step(12);
  const uint64_t id = fr.record(all_reduce(3, 1));
  ASSERT_EQ(id, 1u);
  auto entries = fr.snapshot();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].state, EntryState::kScheduled);
  EXPECT_EQ(entries[0].step, 12);
  EXPECT_STREQ(entries[0].input.dtype, "f32");
  EXPECT_EQ(entries[0].input.numel, 1024);
  fr.started(id);
  fr.completed(id);
  entries = fr.snapshot();
  EXPECT_EQ(entries[0].state, EntryState::kCompleted);
  EXPECT_GT(entries[0].started_ns, 0);
  EXPECT_GE(entries[0].completed_ns, entries[0].started_ns);
  ASSERT_EQ(fr.groups().size(), 1u);
  EXPECT_EQ(fr.groups()[0].ranks, (std::vector<int>{0, 1}));
}

// set_step applies to the thread that set it (the training loop): another thread's entries carry
// no step, and a ThreadScope's entries carry its purpose and its own step; scopes nest.
TEST(RecorderTest, StepBelongsToItsThreadAndScopesNameTheirPurpose) {
  FlightRecorder fr(RecorderOptions{16});
  fr.set_step(12);
  fr.record(all_reduce(3, 1));
  std::thread([&] {
    fr.record(all_reduce(3, 2));  // an untagged thread
    ThreadScope scope("checkpoint writer");
    EXPECT_EQ(thread_purpose(), "checkpoint writer");
    fr.record(all_reduce(3, 3));
    {
      ThreadScope inner("a purpose longer than the entry keeps", 40);
      fr.record(all_reduce(3, 4));
    }
    fr.record(all_reduce(3, 5));
  }).join();
  EXPECT_EQ(thread_purpose(), "");
  fr.record(all_reduce(3, 6));
  const auto entries = fr.snapshot();
  ASSERT_EQ(entries.size(), 6u);
  const std::vector<int64_t> steps = {12, -1, -1, 40, -1, 12};
  const std::vector<std::string> purposes = {
      "", "", "checkpoint writer", "a purpose longer than t", "checkpoint writer", ""};
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].step, steps[i]) << i;
    EXPECT_EQ(std::string(entries[i].purpose), purposes[i]) << i;
  }
}

TEST(RecorderTest, RingKeepsNewestAndIgnoresStaleUpdates) {
  FlightRecorder fr(RecorderOptions{4});
  for (uint64_t s = 1; s <= 10; ++s) fr.record(all_reduce(1, s));
  fr.completed(2);  // overwritten long ago: must not touch the slot now holding id 10 or 6
  const auto entries = fr.snapshot();
  ASSERT_EQ(entries.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(entries[i].seq, 7 + i);
    EXPECT_EQ(entries[i].state, EntryState::kScheduled);
  }
  EXPECT_EQ(fr.recorded(), 10u);
}

TEST(RecorderTest, UserEventsAndTruncation) {
  FlightRecorder fr(RecorderOptions{8});
  fr.record_event("step 1200 begins");
  fr.record_event(std::string(200, 'x'));
  const auto entries = fr.snapshot();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].op, OpType::kUserEvent);
  EXPECT_STREQ(entries[0].text, "step 1200 begins");
  EXPECT_EQ(entries[0].state, EntryState::kCompleted);
  EXPECT_EQ(std::string(entries[1].text).size(), sizeof(entries[1].text) - 1);
}

TEST(RecorderTest, DisabledRecordsNothing) {
  FlightRecorder fr(RecorderOptions{8});
  fr.set_enabled(false);
  EXPECT_EQ(fr.record(all_reduce(1, 1)), 0u);
  fr.completed(0);
  EXPECT_TRUE(fr.snapshot().empty());
}

TEST(RecorderTest, ManyDimsFold) {
  const int64_t shape[8] = {2, 3, 4, 5, 6, 7, 8, 9};
  const TensorMeta m = TensorMeta::make("bf16", shape, 8);
  EXPECT_EQ(m.ndim, kMaxDims);
  EXPECT_EQ(m.shape[kMaxDims - 1], 7 * 8 * 9);
  EXPECT_EQ(m.numel, 2 * 3 * 4 * 5 * 6 * 7 * 8 * 9);
}

TEST(RecorderTest, ConcurrentRecordersAndSnapshotsStayConsistent) {
  FlightRecorder fr(RecorderOptions{64});
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (uint64_t g = 1; g <= 4; ++g) {
    writers.emplace_back([&, g] {
      for (uint64_t s = 1; s <= 5000; ++s) {
        const uint64_t id = fr.record(all_reduce(g, s));
        fr.started(id);
        fr.completed(id);
      }
    });
  }
  std::thread reader([&] {
    while (!stop.load()) {
      for (const Entry& e : fr.snapshot()) {
        // An entry is never a mix of two records: group and seq always came from one call.
        ASSERT_GE(e.group_id, 1u);
        ASSERT_LE(e.group_id, 4u);
        ASSERT_EQ(e.input.numel, 1024);
      }
    }
  });
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  EXPECT_EQ(fr.recorded(), 20000u);
  EXPECT_EQ(fr.snapshot().size(), 64u);
}

TEST(RecorderTest, TracksLastDroppedSequencePerGroup) {
  FlightRecorder fr(RecorderOptions{4});
  // Group 1 gets seqs 1..6, group 2 seqs 1..3, interleaved; then two user events.
  for (uint64_t s = 1; s <= 6; ++s) {
    fr.record(all_reduce(1, s));
    if (s <= 3) fr.record(all_reduce(2, s));
  }
  fr.record_event("a");
  fr.record_event("b");
  // 11 records in a ring of 4: ids 1..7 were overwritten. In order they were
  // g1s1 g2s1 g1s2 g2s2 g1s3 g2s3 g1s4 | kept: g1s5 g1s6 a b.
  const auto drops = fr.dropped();
  ASSERT_EQ(drops.size(), 2u);
  EXPECT_EQ(drops[0].group_id, 1u);
  EXPECT_EQ(drops[0].last_dropped_seq, 4u);
  EXPECT_EQ(drops[0].dropped, 4u);
  EXPECT_EQ(drops[1].group_id, 2u);
  EXPECT_EQ(drops[1].last_dropped_seq, 3u);
  EXPECT_EQ(drops[1].dropped, 3u);
}

TEST(RecorderTest, DroppedSendRecvCountButKeepNoSequence) {
  FlightRecorder fr(RecorderOptions{1});
  RecordArgs send;
  send.group_id = 5;
  send.op = OpType::kSend;
  send.peer = 1;
  send.p2p_seq = 9;
  fr.record(send);
  fr.record(send);
  const auto drops = fr.dropped();
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].last_dropped_seq, 0u);
  EXPECT_EQ(drops[0].dropped, 1u);
}

TEST(RecorderTest, ProcessInfoHasRankHostAndPid) {
  FlightRecorder fr(RecorderOptions{4});
  EXPECT_EQ(fr.process_info().rank, -1);
  fr.set_process_info(3, 8);
  EXPECT_EQ(fr.process_info().rank, 3);
  EXPECT_EQ(fr.process_info().world_size, 8);
  EXPECT_EQ(fr.process_info().pid, static_cast<int>(::getpid()));
  char host[64] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_STREQ(fr.process_info().hostname, host);
  EXPECT_THROW(fr.set_process_info(8, 8), InvalidArgument);
  EXPECT_THROW(fr.set_process_info(-1, 8), InvalidArgument);
}

TEST(RecorderTest, CapturesStackOnlyWhenAsked) {
  RecorderOptions with;
  with.capacity = 4;
  with.capture_stack = true;
  FlightRecorder on(with);
  FlightRecorder off(RecorderOptions{4});
  on.record(all_reduce(1, 1));
  off.record(all_reduce(1, 1));
  const Entry a = on.snapshot().at(0);
  EXPECT_GT(a.stack_depth, 0);
  EXPECT_LE(a.stack_depth, kMaxStackFrames);
  for (int i = 0; i < a.stack_depth; ++i) EXPECT_NE(a.stack[i], 0u);
  EXPECT_EQ(off.snapshot().at(0).stack_depth, 0);
}

TEST(RecorderTest, RecordStartedIsBornStarted) {
  FlightRecorder fr(RecorderOptions{8});
  const uint64_t id = fr.record_started(all_reduce(3, 1));
  Entry e;
  ASSERT_TRUE(fr.read_entry(id, e));
  EXPECT_EQ(e.state, EntryState::kStarted);
  EXPECT_GT(e.enqueued_ns, 0);
  EXPECT_EQ(e.started_ns, e.enqueued_ns);
  EXPECT_EQ(e.completed_ns, 0);
  fr.completed(id);
  ASSERT_TRUE(fr.read_entry(id, e));
  EXPECT_EQ(e.state, EntryState::kCompleted);
  EXPECT_GE(e.completed_ns, e.started_ns);
}

// Capacities that are and are not powers of two index the ring alike.
TEST(RecorderTest, WrapsAtAnyCapacity) {
  for (size_t capacity : {1, 3, 4, 7, 8, 100}) {
    FlightRecorder fr(RecorderOptions{capacity});
    for (uint64_t s = 1; s <= 2 * capacity + 1; ++s) fr.record(all_reduce(1, s));
    const auto entries = fr.snapshot();
    ASSERT_EQ(entries.size(), capacity);
    for (size_t i = 0; i < capacity; ++i) EXPECT_EQ(entries[i].seq, capacity + 2 + i);
    ASSERT_EQ(fr.dropped().size(), 1u);
    EXPECT_EQ(fr.dropped()[0].last_dropped_seq, capacity + 1);
  }
}

TEST(RecorderTest, CycleClockTimesAgreeWithTheMonotonicClock) {
  if (!CycleClock::usable()) GTEST_SKIP() << "no invariant TSC used by the kernel here";
  RecorderOptions o;
  o.capacity = 64;
  FlightRecorder fr(o);
  struct Bracket {
    uint64_t id;
    int64_t before, after;
  };
  std::vector<Bracket> brackets;
  for (uint64_t s = 1; s <= 40; ++s) {
    Bracket b;
    b.before = monotonic_ns();
    b.id = fr.record(all_reduce(1, s));
    b.after = monotonic_ns();
    brackets.push_back(b);
  }
  const TimeBase first = fr.time_base();
  const int64_t spin_until = monotonic_ns() + 3'000'000;  // let the clocks run apart a little
  while (monotonic_ns() < spin_until) {
  }
  const TimeBase second = fr.time_base();
  constexpr int64_t kSlackNs = 2'000;
  int64_t last = 0;
  for (const Bracket& b : brackets) {
    Entry e1, e2;
    ASSERT_TRUE(fr.read_entry(b.id, e1, first));
    ASSERT_TRUE(fr.read_entry(b.id, e2, second));
    EXPECT_GE(e1.enqueued_ns, b.before - kSlackNs);
    EXPECT_LE(e1.enqueued_ns, b.after + kSlackNs);
    EXPECT_NEAR(e1.enqueued_ns, e2.enqueued_ns, kSlackNs);
    EXPECT_GE(e1.enqueued_ns, last);
    last = e1.enqueued_ns;
  }
  EXPECT_GE(first.now_ns(), last);
}

int64_t g_test_now = 0;
int64_t test_clock() noexcept { return g_test_now; }

// A small ring stamped by g_test_now.
RecorderOptions test_clock_options() {
  RecorderOptions o;
  o.capacity = 4;
  o.clock = test_clock;
  return o;
}

TEST(RecorderTest, UsesTheClockItIsGiven) {
  FlightRecorder fr(test_clock_options());
  g_test_now = 1000;
  const uint64_t id = fr.record(all_reduce(1, 1));
  g_test_now = 1500;
  fr.started(id);
  g_test_now = 4000;
  fr.completed(id);
  const Entry e = fr.snapshot().at(0);
  EXPECT_EQ(e.enqueued_ns, 1000);
  EXPECT_EQ(e.started_ns, 1500);
  EXPECT_EQ(e.completed_ns, 4000);
}

TEST(RecorderTest, DeviceCompletionTakesStartedFromTheDeviceTime) {
  FlightRecorder fr(test_clock_options());
  g_test_now = 1000;
  const uint64_t id = fr.record_started(all_reduce(1, 1));
  g_test_now = 9000;  // the observer saw the end event here
  fr.completed(id, Nanoseconds(3000));
  Entry e = fr.snapshot().at(0);
  EXPECT_EQ(e.state, EntryState::kCompleted);
  EXPECT_EQ(e.enqueued_ns, 1000);
  EXPECT_EQ(e.started_ns, 6000);
  EXPECT_EQ(e.completed_ns, 9000);
  // A device time longer than the entry has existed (clock skew): started stays at enqueued.
  g_test_now = 10000;
  const uint64_t late = fr.record(all_reduce(1, 2));
  g_test_now = 10500;
  fr.completed(late, Nanoseconds(2000));
  e = fr.snapshot().at(1);
  EXPECT_EQ(e.started_ns, 10000);
  EXPECT_EQ(e.completed_ns, 10500);
}

TEST(RecorderTest, DeviceCompletionKeepsTheDurationWithCycleTicks) {
  FlightRecorder fr(RecorderOptions{4});  // the cycle counter where it is usable
  const uint64_t id = fr.record(all_reduce(1, 1));
  const int64_t spin_until = monotonic_ns() + 5'000'000;
  while (monotonic_ns() < spin_until) {
  }
  const int64_t before = monotonic_ns();
  fr.completed(id, std::chrono::microseconds(1500));
  const int64_t after = monotonic_ns();
  Entry e;
  ASSERT_TRUE(fr.read_entry(id, e));
  EXPECT_EQ(e.state, EntryState::kCompleted);
  EXPECT_NEAR(e.completed_ns - e.started_ns, 1'500'000, 2'000);
  EXPECT_GE(e.completed_ns, before - 2'000);
  EXPECT_LE(e.completed_ns, after + 2'000);
}

// A span is born started at its beginning and completed at end_span (host time), or from the
// device's duration when a device timed it; disabled, it records nothing and costs an id of 0.
TEST(RecorderTest, SpansRunFromBeginToEnd) {
  FlightRecorder fr(test_clock_options());
  fr.set_step(7);
  g_test_now = 1000;
  const uint64_t host = fr.begin_span("fsdp forward transformer.h.0");
  Entry e = fr.snapshot().at(0);
  EXPECT_EQ(e.op, OpType::kUserSpan);
  EXPECT_EQ(e.state, EntryState::kStarted);
  EXPECT_EQ(e.enqueued_ns, 1000);
  EXPECT_EQ(e.started_ns, 1000);
  EXPECT_EQ(e.completed_ns, 0);
  EXPECT_EQ(e.step, 7);
  EXPECT_EQ(e.group_id, 0u);
  EXPECT_STREQ(e.text, "fsdp forward transformer.h.0");
  g_test_now = 4000;
  fr.end_span(host);
  e = fr.snapshot().at(0);
  EXPECT_EQ(e.state, EntryState::kCompleted);
  EXPECT_EQ(e.started_ns, 1000);
  EXPECT_EQ(e.completed_ns, 4000);

  g_test_now = 5000;
  const uint64_t device = fr.begin_span("fsdp backward transformer.h.0");
  g_test_now = 9000;  // the watchdog saw the end event here; the device measured 2500 ns
  fr.completed(device, Nanoseconds(2500));
  e = fr.snapshot().at(1);
  EXPECT_EQ(e.started_ns, 6500);
  EXPECT_EQ(e.completed_ns, 9000);

  fr.set_enabled(false);
  EXPECT_EQ(fr.begin_span("not recorded"), 0u);
  fr.end_span(0);
  EXPECT_EQ(fr.recorded(), 2u);
}

// Spans are no collective: one overwritten by the ring leaves its group's last dropped seq alone.
TEST(RecorderTest, DroppedSpansKeepNoSequence) {
  FlightRecorder fr(RecorderOptions{2});
  fr.end_span(fr.begin_span("a"));
  fr.end_span(fr.begin_span("b"));
  fr.record(all_reduce(1, 1));
  fr.record(all_reduce(1, 2));
  const auto dropped = fr.dropped();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].group_id, 0u);
  EXPECT_EQ(dropped[0].dropped, 2u);
  EXPECT_EQ(dropped[0].last_dropped_seq, 0u);
}

TEST(RecorderTest, ReRegisteringAGroupReplacesIt) {
  FlightRecorder fr(RecorderOptions{4});
  fr.register_group(1, "a", {0});
  fr.register_group(2, "b", {1});
  fr.register_group(1, "a2", {0, 1});
  const auto groups = fr.groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].id, 2u);
  EXPECT_EQ(groups[1].name, "a2");
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{0, 1}));
}

TEST(RecorderTest, ZeroCapacityIsRejected) {
  EXPECT_THROW(FlightRecorder(RecorderOptions{0}), InvalidArgument);
}

}  // namespace
}  // namespace tessel::fr
