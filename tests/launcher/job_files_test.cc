// The flight-recorder files of one job under tessel-run: its run id (shared by every agent),
// dump and ring folders, the recovery of a dead worker's ring, and the removal of the rings.
#include "tessel/launcher/job_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "child_process.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/store/memory_store.h"

namespace tessel::launcher {
namespace {

namespace fs = std::filesystem;

void clear_env() {
  for (const char* v : {"TESSEL_FR_RUN_ID", "TESSEL_FR_DUMP_DIR", "TESSEL_FR_RING_DIR"}) {
    ::unsetenv(v);
  }
}

TEST(JobFilesTest, RunIdFromTheRdzvIdElseSharedByEveryAgent) {
  clear_env();
  JobRecorderFiles f = job_recorder_files("job 42", nullptr);
  EXPECT_EQ(f.run_id, "job_42");
  EXPECT_EQ(f.dump_dir, "/tmp/tessel_fr/job_42");
  EXPECT_EQ(f.ring_dir, "/tmp/tessel_fr/job_42/rings");
  EXPECT_TRUE(f.per_job_dump_dir);
  // torchrun's default id names no job: the agents of one job agree through its store.
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(5));
  const JobRecorderFiles a = job_recorder_files("none", store.get());
  const JobRecorderFiles b = job_recorder_files("none", store.get());
  EXPECT_EQ(a.run_id.rfind("job-", 0), 0u) << a.run_id;
  EXPECT_EQ(a.run_id, b.run_id);
  EXPECT_NE(job_recorder_files("none", nullptr).run_id, a.run_id);
  ::setenv("TESSEL_FR_RUN_ID", "mine", 1);
  ::setenv("TESSEL_FR_DUMP_DIR", "/scratch/fr", 1);
  ::setenv("TESSEL_FR_RING_DIR", "/dev/shm/rings", 1);
  f = job_recorder_files("job42", store.get());
  EXPECT_EQ(f.run_id, "mine");
  EXPECT_EQ(f.dump_dir, "/scratch/fr");
  EXPECT_EQ(f.ring_dir, "/dev/shm/rings");
  EXPECT_FALSE(f.per_job_dump_dir);
  clear_env();
}

// A worker's ring (this process plays the worker) as FlightRecorder::global() names it.
void make_ring(const JobRecorderFiles& f, int rank) {
  fs::create_directories(f.ring_dir);
  fr::RecorderOptions o;
  o.capacity = 8;
  o.ring_file = (fs::path(f.ring_dir) / fr::ring_file_name(f.run_id, rank, ::getpid())).string();
  fr::FlightRecorder rec(o);
  rec.set_run_id(f.run_id);
  rec.set_process_info(rank, 2);
  rec.register_group(1, "world", {0, 1});
  fr::RecordArgs a{.group_id = 1, .seq = 1, .op = fr::OpType::kAllReduce};
  a.input = a.output = fr::TensorMeta::make("f32", {1});
  rec.record_started(a);  // in flight when it "died"
}

TEST(JobFilesTest, ADeadWorkersRingBecomesItsDumpOnlyWhenItIsThatWorkers) {
  const std::string dir = testing::make_temp_dir("jobfiles");
  const JobRecorderFiles f{"jobR", dir + "/fr", dir + "/fr/rings", false};
  make_ring(f, 1);
  // Another process's ring (an earlier round's worker of this rank), another rank: not used.
  EXPECT_FALSE(recover_worker_ring(f, 1, ::getpid() + 1, "signal 9"));
  EXPECT_FALSE(recover_worker_ring(f, 0, ::getpid(), "signal 9"));
  EXPECT_FALSE(fs::exists(f.dump_dir + "/tessel_fr_rank1.json"));
  const auto text = recover_worker_ring(f, 1, ::getpid(), "signal 9 (no dump)");
  ASSERT_TRUE(text);
  const fr::RankDump d = fr::parse_dump(*text, "recovered");
  EXPECT_EQ(d.trigger, fr::DumpTrigger::kRecovered);
  EXPECT_EQ(d.run_id, "jobR");
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.reason, "signal 9 (no dump)");
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].state, fr::EntryState::kStarted);
  EXPECT_EQ(fr::read_dump(f.dump_dir + "/tessel_fr_rank1.json").run_id, "jobR");
  fs::remove_all(dir);
}

TEST(JobFilesTest, RingsAndEmptyFoldersGoAfterSuccess) {
  const std::string dir = testing::make_temp_dir("jobrings");
  JobRecorderFiles f{"jobS", dir + "/fr/jobS", dir + "/fr/jobS/rings", true};
  make_ring(f, 0);
  make_ring(f, 1);
  std::ofstream(f.ring_dir + "/" + fr::ring_file_name("", -1, 4242)) << "x";
  remove_worker_rings(f, {0, 1}, {4242});
  EXPECT_FALSE(fs::exists(f.ring_dir));
  EXPECT_FALSE(fs::exists(f.dump_dir));
  EXPECT_TRUE(fs::exists(dir + "/fr"));
  // Another node's ring, or a dump, keeps the folders.
  make_ring(f, 0);
  make_ring(f, 1);
  remove_worker_rings(f, {0}, {});
  EXPECT_TRUE(fs::exists(f.ring_dir + "/" + fr::ring_file_name("jobS", 1, 0)));
  EXPECT_FALSE(fs::exists(f.ring_dir + "/" + fr::ring_file_name("jobS", 0, 0)));
  // A folder of the user's (TESSEL_FR_DUMP_DIR) stays even when empty.
  f.per_job_dump_dir = false;
  remove_worker_rings(f, {1}, {});
  EXPECT_FALSE(fs::exists(f.ring_dir));
  EXPECT_TRUE(fs::exists(f.dump_dir));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel::launcher
