// Dumps that cannot mix: the run id in every dump, the per-job default dump folder, ring files
// named by run id and rank, and a folder holding two jobs' dumps refused (reader and CLI).
#include "tessel/flight_recorder/run_id.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/dumper.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

// Clears every variable run_id_from_env reads, and restores nothing: tests set what they need.
void clear_run_env() {
  for (const char* v : {"TESSEL_FR_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                        "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "TESSEL_FR_DUMP_DIR"}) {
    ::unsetenv(v);
  }
}

// One rank's dump of a job `run_id` (empty: no run id, as before version 4) written to `dir`.
void write_rank(const std::filesystem::path& dir, const std::string& run_id, int rank, int world) {
  FlightRecorder fr(RecorderOptions{.capacity = 8});
  if (!run_id.empty()) fr.set_run_id(run_id);
  fr.set_process_info(rank, world);
  fr.register_group(1, "world", [&] {
    std::vector<int> r(world);
    for (int i = 0; i < world; ++i) r[i] = i;
    return r;
  }());
  RecordArgs a{.group_id = 1, .seq = 1, .op = OpType::kAllReduce};
  a.input = a.output = TensorMeta::make("f32", {4});
  fr.completed(fr.record_started(a));
  write_dump(fr, {DumpTrigger::kApi, -1, "test"}, dir);
}

// Runs tessel-trace; returns (exit status, stderr).
std::pair<int, std::string> run_trace(const std::string& args) {
  const std::string command = std::string(TESSEL_TRACE_PATH) + " " + args + " 2>&1 >/dev/null";
  FILE* p = ::popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(RunIdTest, SanitizedIntoAFileName) {
  EXPECT_EQ(sanitize_run_id("a1b2-c3_d4.e5"), "a1b2-c3_d4.e5");
  EXPECT_EQ(sanitize_run_id("job/42 x"), "job_42_x");
  EXPECT_EQ(sanitize_run_id(".."), "_");
  EXPECT_EQ(sanitize_run_id(""), "");
  EXPECT_EQ(sanitize_run_id(std::string(100, 'x')).size(), kMaxRunIdBytes);
}

TEST(RunIdTest, ComesFromTheLauncherInOrder) {
  clear_run_env();
  EXPECT_EQ(run_id_from_env(), "");
  ::setenv("SLURM_JOB_ID", "77", 1);
  EXPECT_EQ(run_id_from_env(), "slurm-77");
  ::setenv("PMIX_NAMESPACE", "prterun-node1-123@1", 1);
  EXPECT_EQ(run_id_from_env(), "pmix-prterun-node1-123_1");
  ::setenv("OMPI_MCA_ess_base_jobid", "1934884865", 1);
  EXPECT_EQ(run_id_from_env(), "ompi-1934884865");
  ::setenv("SLURM_STEP_ID", "3", 1);
  EXPECT_EQ(run_id_from_env(), "slurm-77.3");
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);  // torchrun's default names no job
  EXPECT_EQ(run_id_from_env(), "slurm-77.3");
  ::setenv("TORCHELASTIC_RUN_ID", "job42", 1);
  EXPECT_EQ(run_id_from_env(), "job42");
  ::setenv("TESSEL_FR_RUN_ID", "mine", 1);
  EXPECT_EQ(run_id_from_env(), "mine");
  clear_run_env();
}

TEST(RunIdTest, DefaultDumpFolderIsPerJobAndAnExplicitOneIsKept) {
  clear_run_env();
  EXPECT_EQ(job_dump_dir("job42"), "/tmp/tessel_fr/job42");
  EXPECT_EQ(DumperOptions::from_env("job42").dir, "/tmp/tessel_fr/job42");
  EXPECT_EQ(DumperOptions::from_env().dir, "/tmp/tessel_fr");
  ::setenv("TESSEL_FR_DUMP_DIR", "/scratch/fr_job42", 1);
  EXPECT_EQ(job_dump_dir("job42"), "/scratch/fr_job42");
  EXPECT_EQ(DumperOptions::from_env("job42").dir, "/scratch/fr_job42");
  clear_run_env();
}

TEST(RunIdTest, EveryDumpRecordsItAndOldDumpsStillRead) {
  TempDir dir;
  write_rank(dir.path(), "job/42", 0, 1);  // set_run_id takes what the caller gives
  const RankDump d = read_dump(dir.path() / "tessel_fr_rank0.json");
  EXPECT_EQ(d.version, kDumpFormatVersion);
  EXPECT_EQ(d.version, 4);
  EXPECT_EQ(d.run_id, "job/42");
  // A version-3 dump has no run id: it reads, with "".
  std::ifstream in(dir.path() / "tessel_fr_rank0.json");
  std::stringstream text;
  text << in.rdbuf();
  std::string old = text.str();
  const std::string field = "\"run_id\":\"job/42\",";
  ASSERT_NE(old.find(field), std::string::npos) << old.substr(0, 300);
  old.erase(old.find(field), field.size());
  old.replace(old.find("\"version\":4"), 11, "\"version\":3");
  const RankDump v3 = parse_dump(old, "v3.json");
  EXPECT_EQ(v3.version, 3);
  EXPECT_EQ(v3.run_id, "");
  EXPECT_EQ(v3.entries.size(), 1u);
}

TEST(RunIdTest, TwoJobsInOneFolderAreRefusedNamingRunIdsAndFiles) {
  TempDir dir;
  write_rank(dir.path(), "jobA", 0, 3);
  write_rank(dir.path(), "jobA", 1, 3);
  write_rank(dir.path(), "jobB", 2, 3);
  try {
    read_dump_dir(dir.path());
    FAIL() << "two jobs' dumps were combined";
  } catch (const InvalidArgument& e) {
    const std::string m = e.message();
    for (const char* words : {"2 different jobs",
                              "run id 'jobA' (ranks 0,1: tessel_fr_rank0.json, "
                              "tessel_fr_rank1.json)",
                              "run id 'jobB' (rank 2: tessel_fr_rank2.json)"}) {
      EXPECT_NE(m.find(words), std::string::npos) << words << "\n" << m;
    }
  }
  const auto [status, err] = run_trace("analyze " + dir.path().string());
  EXPECT_EQ(status, 3) << err;
  EXPECT_NE(err.find("run id 'jobB' (rank 2: tessel_fr_rank2.json)"), std::string::npos) << err;
  // --skip-bad does not combine them either, nor does export.
  EXPECT_EQ(run_trace("analyze --skip-bad " + dir.path().string()).first, 3);
  EXPECT_EQ(
      run_trace("export " + dir.path().string() + " --perfetto " + (dir.path() / "t.json").string())
          .first,
      3);
}

TEST(RunIdTest, DumpsWithoutARunIdAreNotRefusedOnThatGround) {
  TempDir dir;
  write_rank(dir.path(), "", 0, 3);
  write_rank(dir.path(), "jobA", 1, 3);
  write_rank(dir.path(), "", 2, 3);
  const DumpSet set = read_dump_dir(dir.path());
  EXPECT_EQ(set.dumps.size(), 3u);
  EXPECT_TRUE(set.problems.empty());
  EXPECT_EQ(run_trace("analyze " + dir.path().string()).first, 0);
}

TEST(RunIdTest, AnalyzeOfTheParentFolderNamesTheJobFolders) {
  TempDir dir;
  write_rank(dir.path() / "jobA", "jobA", 0, 1);
  write_rank(dir.path() / "jobB", "jobB", 0, 1);
  const auto [status, err] = run_trace("analyze " + dir.path().string());
  EXPECT_EQ(status, 3);
  EXPECT_NE(err.find("dump folders of 2 job(s)"), std::string::npos) << err;
  EXPECT_NE(err.find((dir.path() / "jobB").string()), std::string::npos) << err;
}

// The process's recorder under TESSEL_FR_RING_DIR: the ring is named by pid until the rank is
// known, then by run id and rank; a recovered dump carries the run id.
TEST(RunIdTest, GlobalRingFileIsNamedByRunIdAndRank) {
  TempDir dir;
  ::setenv("TESSEL_FR_RING_DIR", dir.path().c_str(), 1);
  FlightRecorder& fr = FlightRecorder::global();
  ::unsetenv("TESSEL_FR_RING_DIR");
  const auto pid_ring = dir.path() / ring_file_name("", -1, ::getpid());
  EXPECT_EQ(fr.ring_file(), pid_ring.string());
  EXPECT_TRUE(std::filesystem::exists(pid_ring));
  fr.set_run_id("job9");
  fr.set_process_info(2, 4);
  fr.record_event("before the end");
  const auto ring = dir.path() / "tessel_fr_job9_rank2.ring";
  EXPECT_EQ(fr.ring_file(), ring.string());
  EXPECT_TRUE(std::filesystem::exists(ring));
  EXPECT_FALSE(std::filesystem::exists(pid_ring));
  const auto recovered = FlightRecorder::recover(ring.string());
  EXPECT_EQ(std::string(recovered->process_info().run_id), "job9");
  EXPECT_EQ(recovered->process_info().rank, 2);
  write_dump(*recovered, {DumpTrigger::kRecovered, -1, "test"}, dir.path() / "dumps");
  const RankDump d = read_dump(dir.path() / "dumps" / "tessel_fr_rank2.json");
  EXPECT_EQ(d.run_id, "job9");
  EXPECT_EQ(d.trigger, DumpTrigger::kRecovered);
  EXPECT_EQ(d.entries.back().text, "before the end");
}

TEST(RunIdTest, RingFileNames) {
  EXPECT_EQ(ring_file_name("job9", 3, 123), "tessel_fr_job9_rank3.ring");
  EXPECT_EQ(ring_file_name("", 3, 123), "tessel_fr_rank3.ring");
  EXPECT_EQ(ring_file_name("job9", -1, 123), "tessel_fr_123.ring");
}

}  // namespace
}  // namespace tessel::fr
