#include "tessel/launcher/hang_dump.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "child_process.h"
#include "tessel/base/error.h"
#include "tessel/collectives/dump_coordinator.h"
#include "tessel/flight_recorder/dumper.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/store/memory_store.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;

// One simulated rank's worker side, as init_process_group sets it up: its own recorder, a dumper
// writing to `dir`, and the DumpCoordinator that answers requests on the store.
struct SimulatedRank {
  SimulatedRank(std::shared_ptr<Store> store, int rank, int world, const std::string& dir)
      : dumper(recorder, fr::DumperOptions{.dir = dir + "/rank" + std::to_string(rank)}),
        coordinator(std::move(store), dumper, rank,
                    DumpCoordinatorOptions{.poll = std::chrono::milliseconds(50)}) {
    recorder.set_process_info(rank, world);
    recorder.record_event("step 7 begins");
    coordinator.start();
  }
  fr::FlightRecorder recorder;
  fr::Dumper dumper;
  DumpCoordinator coordinator;
};

TEST(HangDumpTest, GathersEveryDumpAndRunsTheTraceTool) {
  const std::string dir = testing::make_temp_dir("hang");
  // A stand-in for `tessel-trace analyze DIR`: counts the dumps it was given.
  const std::string tool = dir + "/fake-trace";
  {
    std::ofstream t(tool);
    t << "#!/bin/sh\n[ \"$1\" = analyze ] || exit 9\n"
         "echo \"verdict: $(ls \"$2\" | wc -l) dumps\"\n";
  }
  chmod(tool.c_str(), 0755);
  for (int world : {1, 3}) {
    auto store = std::make_shared<MemoryStore>();
    std::vector<std::unique_ptr<SimulatedRank>> dumpers;
    for (int r = 0; r < world; ++r) {
      dumpers.push_back(std::make_unique<SimulatedRank>(store, r, world, dir + "/ranks"));
    }
    StoreDumpChannel channel(store);
    const std::string dumps = dir + "/dumps_" + std::to_string(world);
    HangReport report =
        gather_flight_recorder_dumps(channel, world, 4, "timeout", dumps, 10s, tool);
    dumpers.clear();
    EXPECT_EQ(report.gathered.size(), static_cast<size_t>(world));
    EXPECT_TRUE(report.missing.empty());
    EXPECT_EQ(report.trace_status, 0);
    EXPECT_EQ(report.verdict, "verdict: " + std::to_string(world) + " dumps\n");
    for (int r = 0; r < world; ++r) {
      const fr::RankDump d = fr::parse_dump(
          testing::read_file(dumps + "/tessel_fr_rank" + std::to_string(r) + ".json"), "r");
      EXPECT_EQ(d.rank, r);
      EXPECT_EQ(d.world_size, world);
      EXPECT_EQ(d.trigger, fr::DumpTrigger::kStoreRequest);
      EXPECT_EQ(d.initiator, -1);
      EXPECT_EQ(d.reason, "launcher, round 4: timeout");
    }
  }
}

TEST(HangDumpTest, MissingRanksAreNamedAndBounded) {
  const std::string dir = testing::make_temp_dir("hang-missing");
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<SimulatedRank>> dumpers;
  dumpers.push_back(std::make_unique<SimulatedRank>(store, 0, 3, dir + "/ranks"));
  dumpers.push_back(
      std::make_unique<SimulatedRank>(store, 2, 3, dir + "/ranks"));  // rank 1 hung hard
  StoreDumpChannel channel(store);
  HangReport report =
      gather_flight_recorder_dumps(channel, 3, 0, "hang", dir + "/d", 300ms, "/bin/true");
  dumpers.clear();
  EXPECT_EQ(report.gathered, (std::vector<int>{0, 2}));
  EXPECT_EQ(report.missing, (std::vector<int>{1}));
  EXPECT_EQ(report.trace_status, 0);
}

// A rank its agent reported as ended is not waited for (the hang-dump timeout is 30 s): its
// final dump is used when the agent posted one, its exit lands in exits.json, and the workers'
// own failure records come back ordered by time.
TEST(HangDumpTest, EndedRanksAreNotWaitedForAndTheirExitsAreKept) {
  const std::string dir = testing::make_temp_dir("hang-ended");
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<SimulatedRank>> dumpers;
  dumpers.push_back(std::make_unique<SimulatedRank>(store, 0, 3, dir + "/ranks"));
  // Rank 1 exited cleanly (no dump); rank 2 crashed and left a dump its agent posts.
  WorkerExitLog exits(store, JobRecorderFiles{"job", dir + "/local", dir + "/local/rings"});
  exits.record(0, 1, 1, 4242, 0, 0);
  exits.record(0, 2, 2, 4343, 0, SIGSEGV);  // its dump is not in dir/local: posted below
  store->set(fr::store_final_dump_key(2), "{\"final\": true}");
  store->set(fr::store_failure_key(0), fr::encode_store_failure(2000, "PeerLost: lost rank 2"));
  store->set(fr::store_failure_key(2), fr::encode_store_failure(1000, "Timeout: all_reduce"));
  StoreDumpChannel channel(store);
  const auto start = std::chrono::steady_clock::now();
  HangReport report =
      gather_flight_recorder_dumps(channel, 3, 0, "hang", dir + "/d", 30s, "/bin/true");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // correctness bound, with slack
  dumpers.clear();
  EXPECT_EQ(report.gathered, (std::vector<int>{0, 2}));
  EXPECT_TRUE(report.missing.empty());
  EXPECT_EQ(testing::read_file(dir + "/d/tessel_fr_rank2.json"), "{\"final\": true}");
  ASSERT_EQ(report.exits.size(), 2u);
  EXPECT_EQ(report.exits[0].exit.rank, 1);
  EXPECT_EQ(report.exits[0].pid, 4242);
  EXPECT_EQ(report.exits[1].exit.signal, SIGSEGV);
  const auto parsed = fr::parse_exits(testing::read_file(dir + "/d/exits.json"), "exits.json");
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[0].exit_code, 0);
  EXPECT_EQ(parsed[1].exit_code, -1);
  ASSERT_EQ(report.failures.size(), 2u);
  EXPECT_EQ(report.failures[0].rank, 2);
  EXPECT_EQ(report.failures[0].reason, "Timeout: all_reduce");
}

TEST(HangDumpTest, MissingTraceToolIsReportedNotThrown) {
  const std::string dir = testing::make_temp_dir("hang-notool");
  auto store = std::make_shared<MemoryStore>();
  SimulatedRank d(store, 0, 1, dir + "/ranks");
  StoreDumpChannel channel(store);
  HangReport report = gather_flight_recorder_dumps(channel, 1, 0, "hang", dir + "/d", 5s,
                                                   "no-such-tessel-trace-tool");
  EXPECT_EQ(report.trace_status, -1);
  EXPECT_NE(report.verdict.find("no-such-tessel-trace-tool"), std::string::npos);
}

}  // namespace
}  // namespace tessel::launcher
