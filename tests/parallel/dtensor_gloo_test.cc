// The DTensor property sweep (smaller) over Gloo with real processes (forked, FileStore
// rendezvous), world sizes 3 and 4.
#include <gtest/gtest.h>

#include "tessel/collectives/file_store.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parallel/dtensor_checks.h"

namespace tessel {
namespace {

void sweep_over_gloo(int world, int cases) {
  const auto outcomes = testing::run_processes(
      world,
      [world, cases](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        testing::check_random_redistributions(
            gloo_create_process_group(store, rank, world, options), 7000 + world, cases);
      },
      std::chrono::seconds(150));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

TEST(DTensorGlooTest, RandomRedistributionsOverThreeProcesses) {
  if (!gloo_is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  sweep_over_gloo(3, 25);
}

TEST(DTensorGlooTest, RandomRedistributionsOverFourProcesses) {
  if (!gloo_is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  sweep_over_gloo(4, 25);
}

}  // namespace
}  // namespace tessel
