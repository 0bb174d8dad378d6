// Context parallelism over Gloo with real processes (forked, FileStore rendezvous): the GPT at
// cp = 3 (odd ring, uneven slices of the 16-token sequences), so ring attention's K/V and dK/dV
// messages cross TCP in forward and backward; every process compares its run with
// single-process training (the tolerances of the threads test).
#include <gtest/gtest.h>

#include <string>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/store/file_store.h"
#include "tests/collectives/collective_checks.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parallel/tp_checks.h"

namespace tessel {
namespace {

TEST(ContextParallelGlooTest, GptAtCpThreeOverThreeProcessesMatchesSingleProcess) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const testing::TpSetup setup{.shape = {3, 1}, .names = {"cp", "tp"}, .steps = 8};
  const auto outcomes = testing::run_processes(
      3,
      [&setup](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        auto pg = gloo::create_process_group(store, rank, 3, options);
        const testing::TpRun got = testing::train_tensor_parallel(pg, setup);
        const std::string error =
            testing::parity_error(got, testing::train_single_process(setup.steps), 1e-5, 1e-5);
        if (!error.empty()) throw testing::CheckFailure(error);
      },
      std::chrono::seconds(100));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

}  // namespace
}  // namespace tessel
