// Flight recorder end to end with real processes: ranks over Gloo (forked, FileStore), one rank
// misbehaves, the watchdog of a waiting rank asks every live rank to dump through the store, and
// the analyzer must name exactly the culprit. More scenarios: fr_fault_scenarios_test.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>

#include "fork_harness.h"
#include "fr_fault_util.h"
#include "tessel/collectives/gloo/gloo_backend.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::fr_dump_exists;

constexpr int kWorld = 3;

TEST(FlightRecorderFaultTest, RankThatSkipsAnAllReduceIsNamed) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const fs::path dir = testing::fresh_fr_dir("skip");
  const auto outcomes = testing::run_processes(
      kWorld,
      [&](int rank, const std::string& store_dir) {
        auto world = testing::join_fr_world(rank, kWorld, store_dir, dir);
        Tensor t = from_vector<float>({1.0f});
        world->all_reduce(t);
        if (rank != 2) {
          EXPECT_THROW(world->all_reduce(t), Error);  // rank 2 never joins: a timeout
        }
        // Every rank stays alive until all three dumps exist (rank 2 "in compute").
        testing::wait_for_fr_dumps(dir, testing::all_ranks(kWorld), rank);
        testing::exit_failed_if_assertions_failed(rank);
      },
      60s);
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  const fr::Verdict verdict = testing::analyze_fr_dir(dir);
  EXPECT_EQ(verdict.status, fr::VerdictStatus::kCulpritFound) << fr::format_verdict(verdict);
  EXPECT_EQ(verdict.culprits, std::vector<int>{2}) << fr::format_verdict(verdict);
  fs::remove_all(dir);
}

TEST(FlightRecorderFaultTest, KilledRankWithoutADumpIsNamed) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const fs::path dir = testing::fresh_fr_dir("kill");
  const auto outcomes = testing::run_processes(
      kWorld,
      [&](int rank, const std::string& store_dir) {
        auto world = testing::join_fr_world(rank, kWorld, store_dir, dir);
        Tensor t = from_vector<float>({1.0f});
        world->all_reduce(t);
        if (rank == 1) ::raise(SIGKILL);  // dies mid-job: no dump from it
        EXPECT_THROW(world->all_reduce(t), Error);
        testing::wait_for_fr_dumps(dir, {0, 2}, rank);
        testing::exit_failed_if_assertions_failed(rank);
      },
      60s);
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[1].signal, SIGKILL) << testing::describe(outcomes[1]);
  EXPECT_TRUE(outcomes[0].exited && outcomes[0].exit_code == 0) << testing::describe(outcomes[0]);
  EXPECT_TRUE(outcomes[2].exited && outcomes[2].exit_code == 0) << testing::describe(outcomes[2]);
  EXPECT_FALSE(fr_dump_exists(dir, 1));
  const fr::Verdict verdict = testing::analyze_fr_dir(dir);
  EXPECT_EQ(verdict.status, fr::VerdictStatus::kCulpritFound) << fr::format_verdict(verdict);
  EXPECT_EQ(verdict.culprits, std::vector<int>{1}) << fr::format_verdict(verdict);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel
