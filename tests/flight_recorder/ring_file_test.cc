#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

// Child: records into a ring file, then dies of SIGKILL (no handler can run).
[[noreturn]] void record_then_sigkill(const std::string& ring_file) {
  RecorderOptions o;
  o.capacity = 8;
  o.ring_file = ring_file;
  FlightRecorder fr(o);
  fr.set_process_info(2, 4);
  fr.register_group(1, "world", {0, 1, 2, 3});
  fr.register_group(9, "tp\tname", {2, 3});
  fr.set_step(17);
  for (uint64_t s = 1; s <= 10; ++s) {
    RecordArgs a;
    a.group_id = 1;
    a.seq = s;
    a.input = TensorMeta::make("f32", {64});
    const uint64_t id = fr.record(a);
    fr.started(id);
    if (s < 10) fr.completed(id);
  }
  fr.record_event("step 17 begins");
  ::raise(SIGKILL);
  ::_exit(1);
}

TEST(RingFileTest, EntriesSurviveSigkillAndRecoverIntoADump) {
  TempDir dir;
  const std::string ring = (dir.path() / "rank2.ring").string();
  const int64_t before_child = monotonic_ns();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) record_then_sigkill(ring);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_EQ(WTERMSIG(status), SIGKILL);

  const auto fr = FlightRecorder::recover(ring);
  EXPECT_EQ(fr->process_info().rank, 2);
  EXPECT_EQ(fr->process_info().world_size, 4);
  EXPECT_EQ(fr->process_info().pid, child);
  EXPECT_EQ(fr->step(), 17);
  EXPECT_EQ(fr->recorded(), 11u);
  const auto entries = fr->snapshot();
  ASSERT_EQ(entries.size(), 8u);  // ids 4..11: seqs 4..10 and the marker
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(entries[i].seq, 4 + i);
  // The child's timestamps (cycle-clock ticks where usable) read back as this machine's
  // monotonic time, in order, inside the child's lifetime.
  const int64_t after_child = monotonic_ns();
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_GE(entries[i].enqueued_ns, before_child - 2'000);
    EXPECT_LE(entries[i].enqueued_ns, after_child + 2'000);
    if (i > 0) {
      EXPECT_GE(entries[i].enqueued_ns, entries[i - 1].enqueued_ns);
    }
  }
  EXPECT_EQ(entries[6].state, EntryState::kStarted);
  EXPECT_STREQ(entries[7].text, "step 17 begins");
  const auto groups = fr->groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].name, "tp name");
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{2, 3}));
  const auto drops = fr->dropped();
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].last_dropped_seq, 3u);

  // Recording into a recovered ring does nothing.
  EXPECT_EQ(fr->record(RecordArgs{}), 0u);
  const auto path = write_dump(*fr, {DumpTrigger::kRecovered, -1, ring}, dir.path());
  const RankDump d = read_dump(path);
  EXPECT_EQ(d.rank, 2);
  EXPECT_EQ(d.trigger, DumpTrigger::kRecovered);
  EXPECT_EQ(d.entries.size(), 8u);
}

TEST(RingFileTest, RejectsFilesThatAreNotRings) {
  TempDir dir;
  EXPECT_THROW(FlightRecorder::recover((dir.path() / "missing").string()), IoError);
  const auto junk = dir.path() / "junk.ring";
  std::ofstream(junk) << std::string(4096, 'x');
  try {
    FlightRecorder::recover(junk.string());
    FAIL() << "accepted junk";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("junk.ring"), std::string::npos) << e.message();
  }
  // A real ring cut short.
  const std::string ring = (dir.path() / "short.ring").string();
  {
    RecorderOptions o;
    o.capacity = 4;
    o.ring_file = ring;
    FlightRecorder fr(o);
    fr.record_event("x");
  }
  std::filesystem::resize_file(ring, std::filesystem::file_size(ring) / 2);
  EXPECT_THROW(FlightRecorder::recover(ring), InvalidArgument);
}

TEST(RingFileTest, UnwritableRingFileIsAnIoError) {
  RecorderOptions o;
  o.capacity = 4;
  o.ring_file = "/nonexistent_dir_for_tessel/ring";
  EXPECT_THROW(FlightRecorder{o}, IoError);
}

}  // namespace
}  // namespace tessel::fr
