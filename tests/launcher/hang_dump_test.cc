#include "tessel/launcher/hang_dump.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "child_process.h"
#include "tessel/base/error.h"
#include "tessel/collectives/memory_store.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;

// A fake flight-recorder dump API: answers the launcher's request on the store with a dump
// naming the rank and the request, the way the real worker-side dumper will.
class FakeDumper {
 public:
  FakeDumper(std::shared_ptr<Store> store, int rank)
      : thread_([store, rank] {
          try {
            const std::string request = store->get(kDumpRequestKey, 10s);
            store->set(dump_key(rank),
                       "{\"rank\": " + std::to_string(rank) + ", \"request\": \"" + request + "\"}");
          } catch (const Timeout&) {
          }
        }) {}
  ~FakeDumper() { thread_.join(); }

 private:
  std::thread thread_;
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
    std::vector<std::unique_ptr<FakeDumper>> dumpers;
    for (int r = 0; r < world; ++r) dumpers.push_back(std::make_unique<FakeDumper>(store, r));
    StoreDumpChannel channel(store);
    const std::string dumps = dir + "/dumps_" + std::to_string(world);
    HangReport report = gather_flight_recorder_dumps(channel, world, 4, "timeout", dumps, 10s, tool);
    dumpers.clear();
    EXPECT_EQ(report.gathered.size(), static_cast<size_t>(world));
    EXPECT_TRUE(report.missing.empty());
    EXPECT_EQ(report.trace_status, 0);
    EXPECT_EQ(report.verdict, "verdict: " + std::to_string(world) + " dumps\n");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(testing::read_file(dumps + "/rank_" + std::to_string(r) + ".json"),
                "{\"rank\": " + std::to_string(r) + ", \"request\": \"4:timeout\"}");
    }
  }
}

TEST(HangDumpTest, MissingRanksAreNamedAndBounded) {
  const std::string dir = testing::make_temp_dir("hang-missing");
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<FakeDumper>> dumpers;
  dumpers.push_back(std::make_unique<FakeDumper>(store, 0));
  dumpers.push_back(std::make_unique<FakeDumper>(store, 2));  // rank 1 hung hard: no dump
  StoreDumpChannel channel(store);
  HangReport report =
      gather_flight_recorder_dumps(channel, 3, 0, "hang", dir + "/d", 300ms, "/bin/true");
  dumpers.clear();
  EXPECT_EQ(report.gathered, (std::vector<int>{0, 2}));
  EXPECT_EQ(report.missing, (std::vector<int>{1}));
  EXPECT_EQ(report.trace_status, 0);
}

TEST(HangDumpTest, MissingTraceToolIsReportedNotThrown) {
  const std::string dir = testing::make_temp_dir("hang-notool");
  auto store = std::make_shared<MemoryStore>();
  FakeDumper d(store, 0);
  StoreDumpChannel channel(store);
  HangReport report = gather_flight_recorder_dumps(channel, 1, 0, "hang", dir + "/d", 5s,
                                                   "no-such-tessel-trace-tool");
  EXPECT_EQ(report.trace_status, -1);
  EXPECT_NE(report.verdict.find("no-such-tessel-trace-tool"), std::string::npos);
}

}  // namespace
}  // namespace tessel::launcher
