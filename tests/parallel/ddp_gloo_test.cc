// replicate() over Gloo with real processes (forked, FileStore rendezvous): the small GPT's
// training with small buckets, so many async all_reduces cross TCP while backward runs. Two
// processes match one process accumulating their micro-batches bit for bit (a sum of two is the
// same in any order); three match the whole-batch run within the threads test's tolerances.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/store/file_store.h"
#include "tests/collectives/collective_checks.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parallel/ddp_checks.h"

namespace tessel {
namespace {

constexpr int64_t kSteps = 8;

// Runs check(this rank's trajectory) in each of `world` processes; a throw fails the test.
template <typename Check>
void train_over_gloo(int world, Check check) {
  const auto outcomes = testing::run_processes(
      world,
      [world, &check](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        auto pg = gloo::create_process_group(store, rank, world, options);
        check(testing::train_replicated_rank(pg, kSteps, {.bucket_bytes = 8 << 10}));
      },
      std::chrono::seconds(100));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

TEST(DDPGlooTest, TwoProcessesTrainBitwiseLikeAccumulatedMicroBatches) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  train_over_gloo(2, [](const testing::Trajectory& ddp) {
    const testing::Trajectory reference = testing::train_accumulated(2, kSteps);
    if (ddp.losses != reference.losses || ddp.grads != reference.grads ||
        ddp.params != reference.params || ddp.synced_backwards != kSteps) {
      throw testing::CheckFailure(fmt::format(
          "DDP over Gloo differs from the accumulated micro-batches: loss {} vs {}, parameters "
          "{:.2e} apart",
          ddp.losses.back(), reference.losses.back(),
          testing::relative_diff(ddp.params, reference.params)));
    }
  });
}

TEST(DDPGlooTest, ThreeProcessesTrainLikeOneProcessOnTheWholeBatch) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  train_over_gloo(3, [](const testing::Trajectory& ddp) {
    const testing::Trajectory whole = testing::train_whole_batch(kSteps);
    for (int64_t s = 0; s < kSteps; ++s) {
      const double loss = std::abs(ddp.losses[s] - whole.losses[s]) / whole.losses[s];
      const double grad = testing::relative_diff(ddp.grads[s], whole.grads[s]);
      if (loss > 1e-5 || grad > 1e-4) {
        throw testing::CheckFailure(fmt::format(
            "step {}: loss {:.2e} and gradients {:.2e} from the whole-batch run", s, loss, grad));
      }
    }
    const double params = testing::relative_diff(ddp.params, whole.params);
    if (params > 2e-4) {
      throw testing::CheckFailure(fmt::format("final parameters {:.2e} apart", params));
    }
  });
}

}  // namespace
}  // namespace tessel
