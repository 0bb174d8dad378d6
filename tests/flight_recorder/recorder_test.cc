#include "tessel/flight_recorder/recorder.h"

#include <thread>

#include <gtest/gtest.h>

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

TEST(RecorderTest, ZeroCapacityIsRejected) {
  EXPECT_THROW(FlightRecorder(RecorderOptions{0}), InvalidArgument);
}

}  // namespace
}  // namespace tessel::fr
