// tessel-run keeps each job's flight-recorder files apart: workers dump into the job's folder
// (<TESSEL_FR_DUMP_DIR or /tmp/tessel_fr/<run id>>), keep their rings in its rings/ folder named
// by run id and rank, a SIGKILLed worker's ring becomes its dump in the verdict, and a job that
// succeeded leaves no ring behind.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "child_process.h"
#include "tessel/flight_recorder/reader.h"

namespace tessel::launcher {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::ChildProcess;

std::vector<std::string> run_args(std::vector<std::string> flags, std::vector<std::string> worker) {
  std::vector<std::string> argv{TESSEL_RUN_PATH};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(TEST_WORKER_PATH);
  argv.insert(argv.end(), worker.begin(), worker.end());
  return argv;
}

TEST(TesselRunFrFilesTest, RingsAreNamedByRunIdAndRankAndRemovedAfterSuccess) {
  const std::string dir = testing::make_temp_dir("frrings");
  const std::string id = "ringjob" + std::to_string(::getpid());
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", "2", "--rdzv-id", id, "--log-dir",
                             dir + "/logs"},
                            {"ring"}),
                   {"TESSEL_FR_DUMP_DIR=" + dir + "/fr"}, dir + "/run");
  ASSERT_EQ(run.wait(60s), 0) << run.err();
  for (int r = 0; r < 2; ++r) {
    const std::string ring = fmt::format("{}/fr/rings/tessel_fr_{}_rank{}.ring", dir, id, r);
    EXPECT_NE(run.out().find(fmt::format("RING {} 1", ring)), std::string::npos) << ring << "\n"
                                                                                 << run.out();
  }
  EXPECT_FALSE(fs::exists(dir + "/fr/rings")) << "rings left after a successful job";
  fs::remove_all(dir);
}

// Rank 1 is SIGKILLed after one all_reduce: its agent recovers its ring into its dump (into the
// job's folder and the round's), and the verdict still names rank 1, now with where it was.
TEST(TesselRunFrFilesTest, SigkilledWorkersRingIsRecoveredForTheVerdict) {
  const std::string dir = testing::make_temp_dir("frkill");
  const std::string id = "killjob" + std::to_string(::getpid());
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", "3", "--rdzv-id", id, "--log-dir",
                             dir + "/logs", "--hang-dump-timeout", "30s"},
                            {"fault", "kill", "1"}),
                   {"TESSEL_FR_DUMP_DIR=" + dir + "/fr"}, dir + "/run");
  EXPECT_EQ(run.wait(90s).value_or(-1), 128 + SIGKILL) << run.err();
  EXPECT_NE(run.err().find("verdict: CULPRIT FOUND: rank 1\n"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("crashed (SIGKILL)"), std::string::npos) << run.err();
  for (const std::string file : {dir + "/fr/tessel_fr_rank1.json",
                                 dir + "/logs/flight_recorder_round_0/tessel_fr_rank1.json"}) {
    ASSERT_TRUE(fs::exists(file)) << file << "\n" << run.err();
    const fr::RankDump d = fr::read_dump(file);
    EXPECT_EQ(d.trigger, fr::DumpTrigger::kRecovered) << file;
    EXPECT_EQ(d.run_id, id) << file;
    EXPECT_EQ(d.reason.rfind("signal 9", 0), 0u) << d.reason;
  }
  // Every dump in the job's folder is this job's; a failed job keeps its rings.
  const fr::DumpSet set = fr::read_dump_dir(dir + "/fr");
  for (const auto& d : set.dumps) EXPECT_EQ(d.run_id, id) << d.path;
  EXPECT_TRUE(fs::exists(fmt::format("{}/fr/rings/tessel_fr_{}_rank1.ring", dir, id)));
  fs::remove_all(dir);
}

// Without TESSEL_FR_DUMP_DIR the workers dump into /tmp/tessel_fr/<run id>/, where the agent
// finds a crashed worker's fatal-signal dump.
TEST(TesselRunFrFilesTest, DefaultDumpFolderIsTheJobsOwn) {
  const std::string dir = testing::make_temp_dir("frdefault");
  const std::string id = "crashjob" + std::to_string(::getpid());
  const std::string job_dir = "/tmp/tessel_fr/" + id;
  fs::remove_all(job_dir);
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", "3", "--rdzv-id", id, "--log-dir",
                             dir + "/logs", "--hang-dump-timeout", "30s"},
                            {"fault", "crash", "1"}),
                   {"TESSEL_FR_DUMP_DIR="}, dir + "/run");
  EXPECT_EQ(run.wait(90s).value_or(-1), 128 + SIGSEGV) << run.err();
  EXPECT_NE(run.err().find("crashed (SIGSEGV)"), std::string::npos) << run.err();
  ASSERT_TRUE(fs::exists(job_dir + "/tessel_fr_rank1.json")) << run.err();
  const fr::RankDump d = fr::read_dump(job_dir + "/tessel_fr_rank1.json");
  EXPECT_EQ(d.trigger, fr::DumpTrigger::kFatalSignal);
  EXPECT_EQ(d.run_id, id);
  fs::remove_all(job_dir);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel::launcher
