#include "tessel/flight_recorder/dumper.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/reader.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

DumperOptions options_for(const TempDir& dir, int signal = 0, bool fatal = false) {
  DumperOptions o;
  o.dir = dir.path();
  o.dump_signal = signal;
  o.dump_on_fatal = fatal;
  return o;
}

TEST(DumperTest, RequestIsWrittenByTheDumperThread) {
  TempDir dir;
  FlightRecorder fr(RecorderOptions{16});
  fr.set_process_info(1, 4);
  fr.record_event("marker");
  Dumper dumper(fr, options_for(dir));
  dumper.start();
  dumper.request_dump({DumpTrigger::kApi, -1, "asked"});
  ASSERT_TRUE(dumper.wait_for_dumps(1, 30s));
  const RankDump d = read_dump(dir.path() / "tessel_fr_rank1.json");
  EXPECT_EQ(d.trigger, DumpTrigger::kApi);
  EXPECT_EQ(d.reason, "asked");
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].text, "marker");
  EXPECT_EQ(dumper.last_error(), "");
}

TEST(DumperTest, TimeoutAndStoreRequestCarryTriggerAndInitiator) {
  TempDir dir;
  FlightRecorder fr(RecorderOptions{16});
  fr.set_process_info(2, 4);
  Dumper dumper(fr, options_for(dir));
  dumper.start();
  dumper.notify_timeout(2, "all_reduce #5 timed out");
  ASSERT_TRUE(dumper.wait_for_dumps(1, 30s));
  RankDump d = read_dump(dir.path() / "tessel_fr_rank2.json");
  EXPECT_EQ(d.trigger, DumpTrigger::kTimeout);
  EXPECT_EQ(d.initiator, 2);
  EXPECT_EQ(d.reason, "all_reduce #5 timed out");

  const uint64_t before = dumper.dumps_written();
  dumper.notify_store_request(encode_store_dump_request(3, "rank 3 timed out in 'dp' #9"));
  ASSERT_TRUE(dumper.wait_for_dumps(before + 1, 30s));
  d = read_dump(dir.path() / "tessel_fr_rank2.json");
  EXPECT_EQ(d.trigger, DumpTrigger::kStoreRequest);
  EXPECT_EQ(d.initiator, 3);
  EXPECT_EQ(d.reason, "rank 3 timed out in 'dp' #9");
}

TEST(DumperTest, StoreRequestEncodingRoundTripsAndRejectsGarbage) {
  const DumpRequest r = decode_store_dump_request(encode_store_dump_request(12, "a b c"));
  EXPECT_EQ(r.trigger, DumpTrigger::kStoreRequest);
  EXPECT_EQ(r.initiator, 12);
  EXPECT_EQ(r.reason, "a b c");
  EXPECT_EQ(decode_store_dump_request("-1").initiator, -1);
  EXPECT_THROW(decode_store_dump_request(""), InvalidArgument);
  EXPECT_THROW(decode_store_dump_request("x y"), InvalidArgument);
  EXPECT_THROW(decode_store_dump_request("-7 y"), InvalidArgument);
}

TEST(DumperTest, SignalWakesTheDumperThread) {
  TempDir dir;
  FlightRecorder fr(RecorderOptions{16});
  fr.set_process_info(0, 1);
  Dumper dumper(fr, options_for(dir, SIGUSR1));
  dumper.start();
  ASSERT_EQ(::raise(SIGUSR1), 0);
  ASSERT_TRUE(dumper.wait_for_dumps(1, 30s));
  const RankDump d = read_dump(dir.path() / "tessel_fr_rank0.json");
  EXPECT_EQ(d.trigger, DumpTrigger::kSignal);
}

TEST(DumperTest, StopRestoresThePreviousSignalHandler) {
  TempDir dir;
  FlightRecorder fr(RecorderOptions{16});
  struct sigaction old = {};
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGUSR2, &ignore, &old), 0);
  {
    Dumper dumper(fr, options_for(dir, SIGUSR2));
    dumper.start();
    struct sigaction now = {};
    ::sigaction(SIGUSR2, nullptr, &now);
    EXPECT_NE(now.sa_handler, SIG_IGN);
  }
  struct sigaction after = {};
  ::sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, SIG_IGN);
  ::sigaction(SIGUSR2, &old, nullptr);
}

TEST(DumperTest, OnlyOneDumperOwnsTheSignals) {
  TempDir dir;
  FlightRecorder fr(RecorderOptions{16});
  Dumper first(fr, options_for(dir));
  Dumper second(fr, options_for(dir));
  first.start();
  EXPECT_THROW(second.start(), InvalidArgument);
  first.stop();
  EXPECT_NO_THROW(second.start());
}

TEST(DumperTest, RequestBeforeStartIsWrittenSynchronously) {
  TempDir dir;
  FlightRecorder fr(RecorderOptions{16});
  fr.set_process_info(3, 4);
  Dumper dumper(fr, options_for(dir));
  dumper.request_dump({DumpTrigger::kError, 3, "failed"});
  EXPECT_EQ(dumper.dumps_written(), 1u);
  EXPECT_EQ(read_dump(dir.path() / "tessel_fr_rank3.json").trigger, DumpTrigger::kError);
}

TEST(DumperTest, FailedDumpIsReportedNotThrownFromTheThread) {
  TempDir dir;
  const auto file = dir.path() / "not_a_dir";
  std::ofstream(file) << "x";
  FlightRecorder fr(RecorderOptions{16});
  DumperOptions o;
  o.dir = file;
  Dumper dumper(fr, o);
  dumper.request_dump({});
  EXPECT_NE(dumper.last_error().find("not_a_dir"), std::string::npos) << dumper.last_error();
  EXPECT_EQ(dumper.dumps_written(), 0u);
}

void crash_with(int sig, const std::filesystem::path& dir) {
  // The handler chains to whatever was installed before it; make that the default action (a
  // sanitizer's handler would report and exit instead of dying of the signal).
  std::signal(sig, SIG_DFL);
  FlightRecorder fr(RecorderOptions{16});
  fr.set_process_info(5, 8);
  fr.register_group(1, "world", {0, 1, 2, 3, 4, 5, 6, 7});
  RecordArgs a;
  a.group_id = 1;
  a.seq = 7;
  a.input = TensorMeta::make("f32", {16});
  fr.started(fr.record(a));
  fr.record_event("about to crash");
  DumperOptions o;
  o.dir = dir;
  o.dump_on_fatal = true;
  Dumper dumper(fr, o);
  dumper.start();
  if (sig == SIGABRT) std::abort();
  ::raise(sig);
}

class FatalSignalTest : public ::testing::TestWithParam<int> {};

TEST_P(FatalSignalTest, DumpsThenDiesOfTheSameSignal) {
  const int sig = GetParam();
  TempDir dir;
  EXPECT_EXIT(crash_with(sig, dir.path()), ::testing::KilledBySignal(sig), "");
  const RankDump d = read_dump(dir.path() / "tessel_fr_rank5.json");
  EXPECT_EQ(d.trigger, DumpTrigger::kFatalSignal);
  EXPECT_EQ(d.reason, "signal " + std::to_string(sig));
  ASSERT_EQ(d.entries.size(), 2u);
  EXPECT_EQ(d.entries[0].seq, 7u);
  EXPECT_EQ(d.entries[0].state, EntryState::kStarted);
  EXPECT_EQ(d.entries[1].text, "about to crash");
  ASSERT_EQ(d.groups.size(), 1u);
  EXPECT_EQ(d.groups[0].ranks.size(), 8u);
}

INSTANTIATE_TEST_SUITE_P(Signals, FatalSignalTest,
                         ::testing::Values(SIGSEGV, SIGABRT, SIGBUS, SIGFPE),
                         [](const auto& info) { return std::string(sigabbrev_np(info.param)); });

TEST(DumperTest, OptionsComeFromTheKnobs) {
  ::setenv("TESSEL_FR_DUMP_DIR", "/var/tmp/fr_dumps", 1);
  ::setenv("TESSEL_FR_DUMP_SIGNAL", "usr2", 1);
  ::setenv("TESSEL_FR_DUMP_ON_FATAL", "0", 1);
  DumperOptions o = DumperOptions::from_env();
  EXPECT_EQ(o.dir, "/var/tmp/fr_dumps");
  EXPECT_EQ(o.dump_signal, SIGUSR2);
  EXPECT_FALSE(o.dump_on_fatal);
  ::setenv("TESSEL_FR_DUMP_SIGNAL", "SIGBOGUS", 1);
  try {
    DumperOptions::from_env();
    FAIL() << "accepted SIGBOGUS";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("TESSEL_FR_DUMP_SIGNAL"), std::string::npos) << e.message();
  }
  ::unsetenv("TESSEL_FR_DUMP_DIR");
  ::unsetenv("TESSEL_FR_DUMP_SIGNAL");
  ::unsetenv("TESSEL_FR_DUMP_ON_FATAL");
  o = DumperOptions::from_env();
  EXPECT_EQ(o.dir, "/tmp/tessel_fr");
  EXPECT_EQ(o.dump_signal, SIGUSR1);
  EXPECT_TRUE(o.dump_on_fatal);
}

TEST(DumperTest, ParsesSignalNames) {
  EXPECT_EQ(parse_signal("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(parse_signal("usr2"), SIGUSR2);
  EXPECT_EQ(parse_signal("12"), 12);
  EXPECT_EQ(parse_signal("none"), 0);
  EXPECT_EQ(parse_signal(""), 0);
  EXPECT_THROW(parse_signal("SIGFOO"), InvalidArgument);
  EXPECT_THROW(parse_signal("9"), InvalidArgument);
  EXPECT_THROW(parse_signal("999"), InvalidArgument);
}

}  // namespace
}  // namespace tessel::fr
