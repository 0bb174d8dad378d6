// Flight recorder end to end with real processes: ranks over Gloo (forked, FileStore), one rank
// misbehaves, the watchdog of a waiting rank asks every live rank to dump through the store, and
// the analyzer must name exactly the culprit.
#include <signal.h>
#include <stdlib.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "fork_harness.h"
#include "store_test_util.h"
#include "tessel/base/error.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/collectives/init.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/reader.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kWorld = 3;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_fr_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool dump_exists(const fs::path& dir, int rank) {
  return fs::exists(dir / fr::dump_file_name(rank, 0));
}

// Joins the Gloo world through the harness's FileStore with short timeouts, dumping to `dir`.
std::shared_ptr<ProcessGroup> join(int rank, const std::string& store_dir, const fs::path& dir) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
  ::setenv("TESSEL_FR_DUMP_DIR", dir.c_str(), 1);
  InitOptions options;
  options.backend = "gloo";
  options.store_dir = store_dir;
  options.timeout = 2s;
  options.gloo.hostname = "127.0.0.1";
  return init_process_group(options);
}

fr::Verdict analyze_dir(const fs::path& dir) { return fr::analyze(fr::read_dump_dir(dir)); }

TEST(FlightRecorderFaultTest, RankThatSkipsAnAllReduceIsNamed) {
  if (!gloo_is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const fs::path dir = fresh_dir("skip");
  const auto outcomes = testing::run_processes(
      kWorld,
      [&](int rank, const std::string& store_dir) {
        auto world = join(rank, store_dir, dir);
        Tensor t = from_vector<float>({1.0f});
        world->all_reduce(t);
        if (rank != 2) {
          EXPECT_THROW(world->all_reduce(t), Error);  // rank 2 never joins: a timeout
        }
        // Every rank stays alive until all three dumps exist (rank 2 "in compute").
        const bool all = testing::wait_until(
            [&] {
              for (int r = 0; r < kWorld; ++r) {
                if (!dump_exists(dir, r)) return false;
              }
              return true;
            },
            20s);
        TESSEL_CHECK(all, Timeout, "rank {}: not every rank dumped within 20s", rank);
      },
      60s);
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  const fr::Verdict verdict = analyze_dir(dir);
  EXPECT_EQ(verdict.status, fr::VerdictStatus::kCulpritFound) << fr::format_verdict(verdict);
  EXPECT_EQ(verdict.culprits, std::vector<int>{2}) << fr::format_verdict(verdict);
  fs::remove_all(dir);
}

TEST(FlightRecorderFaultTest, KilledRankWithoutADumpIsNamed) {
  if (!gloo_is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const fs::path dir = fresh_dir("kill");
  const auto outcomes = testing::run_processes(
      kWorld,
      [&](int rank, const std::string& store_dir) {
        auto world = join(rank, store_dir, dir);
        Tensor t = from_vector<float>({1.0f});
        world->all_reduce(t);
        if (rank == 1) ::raise(SIGKILL);  // dies mid-job: no dump from it
        EXPECT_THROW(world->all_reduce(t), Error);
        const bool both = testing::wait_until(
            [&] { return dump_exists(dir, 0) && dump_exists(dir, 2); }, 20s);
        TESSEL_CHECK(both, Timeout, "rank {}: the live ranks did not dump within 20s", rank);
      },
      60s);
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[1].signal, SIGKILL) << testing::describe(outcomes[1]);
  EXPECT_TRUE(outcomes[0].exited && outcomes[0].exit_code == 0) << testing::describe(outcomes[0]);
  EXPECT_TRUE(outcomes[2].exited && outcomes[2].exit_code == 0) << testing::describe(outcomes[2]);
  EXPECT_FALSE(dump_exists(dir, 1));
  const fr::Verdict verdict = analyze_dir(dir);
  EXPECT_EQ(verdict.status, fr::VerdictStatus::kCulpritFound) << fr::format_verdict(verdict);
  EXPECT_EQ(verdict.culprits, std::vector<int>{1}) << fr::format_verdict(verdict);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel
