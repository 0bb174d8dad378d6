// The pipeline runtime composed with data parallelism inside its stages, on rank threads: a tiny
// GPT split over pp = 2 stages, each stage under HSDP (fully_shard over a (dp_replicate,
// dp_shard) = (2, 2) mesh) or DDP (replicate over dp = 2), each data-parallel rank on its rows of
// the batch. The mean of the ranks' losses matches one process training the whole model on the
// whole batch, and each stage communicates its gradients once per step (one reduce_scatter, or
// one synced DDP backward), with 1F1B and with zero-bubble (whose B then runs the whole
// backward).

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/pp/gpt_stage.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/pp_checks.h"

namespace tessel::pp {
namespace {

constexpr int kSteps = 6;
// Relative, per step: micro-batch and data-parallel gradients are summed in another order.
constexpr double kTolerance = 2e-4;

nn::GptConfig tiny_config() { return testing::tiny_gpt(4); }

using testing::adamw_options;
using testing::batch;
using testing::kBatch;
using testing::kMaxNorm;
using testing::kSeq;

// One process, the whole model, the whole batch.
const std::vector<double>& reference_losses() {
  static const std::vector<double> losses = testing::one_process_losses(tiny_config(), kSteps);
  return losses;
}

enum class DataParallel { kHsdp, kDdp };

// What each rank's first stage communicated over the run.
struct CommCounts {
  int64_t reduce_scatters = 0;   // HSDP
  int64_t synced_backwards = 0;  // DDP
  int64_t ddp_all_reduces = 0;   // DDP
  int64_t weight_grads_deferred = 0;
};

// Trains the pipeline of pp = 2 stages with `replicas` x `shards` data-parallel ranks per stage
// and checks each step's mean loss over the ranks against one process. Returns every rank's counts.
std::vector<CommCounts> expect_parity(DataParallel how, int replicas, int shards,
                                      const PipelineSchedule& schedule) {
  const int pp = 2;
  const int dp = replicas * shards;
  const int world = pp * dp;
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  std::vector<CommCounts> counts(static_cast<size_t>(world));
  std::mutex mu;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {pp, replicas, shards},
                                       {"pp", "dp_replicate", "dp_shard"});
    const int stage_rank = static_cast<int>(mesh.local_rank("pp"));
    const int dp_rank =
        static_cast<int>(mesh.local_rank("dp_replicate") * shards + mesh.local_rank("dp_shard"));
    auto stages = make_gpt_stages(tiny_config(), uniform_layout(4, 2), stage_rank, pp);
    std::vector<LocalStage> local;
    for (auto& s : stages) {
      LocalStage st{s->stage(), s};
      if (how == DataParallel::kHsdp) {
        fully_shard(*s, mesh.slice({"dp_replicate", "dp_shard"}));
      } else {
        const DeviceMesh dp_mesh = mesh.flatten({"dp_replicate", "dp_shard"}, "dp");
        st.ddp = std::make_shared<DDPModule>(replicate(*s, dp_mesh, {.dim = "dp"}));
      }
      local.push_back(st);
    }
    nn::optim::AdamW* opt = nullptr;
    PipelineRuntime* runtime_ptr = nullptr;
    PipelineRuntime runtime(mesh.group("pp"), schedule, local, nn::GPT::loss,
                            {.on_step =
                                 [&] {
                                   clip_grad_norm(*runtime_ptr, kMaxNorm);
                                   opt->step();
                                 },
                             .tied_parameters = gpt_tied_parameters()});
    runtime_ptr = &runtime;
    nn::optim::AdamW adamw(runtime.parameters(), adamw_options());
    opt = &adamw;
    std::vector<double> mine;
    const int64_t rows = kBatch / dp;
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(step);
      mine.push_back(runtime.step(contiguous(narrow(x, 0, dp_rank * rows, rows)),
                                  contiguous(narrow(y, 0, dp_rank * rows, rows))));
    }
    CommCounts c;
    if (how == DataParallel::kHsdp) {
      c.reduce_scatters = fsdp_module(*stages[0])->stats().reduce_scatters;
    } else {
      c.synced_backwards = local[0].ddp->stats().synced_backwards;
      c.ddp_all_reduces = local[0].ddp->stats().all_reduces;
    }
    c.weight_grads_deferred = runtime.stats().weight_grads_deferred;
    std::lock_guard lock(mu);
    losses[static_cast<size_t>(pg.rank())] = mine;
    counts[static_cast<size_t>(pg.rank())] = c;
  });
  const auto& ref = reference_losses();
  for (int step = 0; step < kSteps; ++step) {
    double sum = 0;
    for (const auto& l : losses) sum += l[static_cast<size_t>(step)];
    const double mean = sum / world;
    EXPECT_NEAR(mean, ref[static_cast<size_t>(step)], kTolerance * std::abs(ref[step])) << step;
  }
  return counts;
}

// (pp, dp_replicate, dp_shard) = (2, 2, 2): one reduce_scatter per stage and step.
TEST(PipelineHsdpTest, Pp2Replicate2Shard2MatchesOneProcess) {
  const auto counts = expect_parity(DataParallel::kHsdp, 2, 2, make_1f1b(2, 2));
  for (const CommCounts& c : counts) EXPECT_EQ(c.reduce_scatters, kSteps);
}

// (pp, dp) = (2, 2), DDP: one synced backward per stage and step (the stage's last), however
// 1F1B interleaves the micro-batches' forwards and backwards.
TEST(PipelineDdpTest, Pp2Dp2MatchesOneProcessSyncingOncePerStep) {
  const auto counts = expect_parity(DataParallel::kDdp, 1, 2, make_1f1b(2, 4));
  for (const CommCounts& c : counts) {
    EXPECT_EQ(c.synced_backwards, kSteps);
    EXPECT_GT(c.ddp_all_reduces, 0);
  }
}

// Zero-bubble over DDP stages: B runs the whole backward (DDP's hooks want each gradient within
// the pass), nothing is deferred to W, and the losses still match.
TEST(PipelineDdpTest, ZeroBubbleKeepsTheWholeBackwardInB) {
  const auto counts =
      expect_parity(DataParallel::kDdp, 1, 2, make_schedule("zero-bubble", 2, 4, 1));
  for (const CommCounts& c : counts) {
    EXPECT_EQ(c.synced_backwards, kSteps);
    EXPECT_EQ(c.weight_grads_deferred, 0);
  }
}

}  // namespace
}  // namespace tessel::pp
