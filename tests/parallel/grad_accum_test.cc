// Gradient accumulation as examples/train_gpt runs it (--grad-accum N, --grad-sync last|every):
// each rank's rows of the global batch split into N micro-batches, each micro-batch's loss
// scaled by 1/N, gradients communicated on the last micro-batch only (FSDP's
// set_requires_gradient_sync, DDP's no_sync) or on every one. The losses and gradients of N
// micro-batches equal those of one step on the whole batch within 1e-5 (relative; f32 sums in
// another order), under FSDP and DDP, on rank threads; the flight recorder shows one gradient
// reduce_scatter per FSDP group and step with sync on the last (N with sync on every one), and
// one all_reduce per DDP bucket and step.

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/fsdp_checks.h"

namespace tessel {
namespace {

constexpr int kSteps = 3;
constexpr double kTolerance = 1e-5;  // relative, losses and gradients

enum class Parallel { kFsdp, kDdp };
enum class Sync { kLast, kEvery };

struct Trained {
  std::vector<float> losses;              // per step, mean over ranks
  std::vector<std::vector<float>> grads;  // per step: rank 0's gradients, flattened
  std::vector<int64_t> grad_collectives;  // per step, over all ranks
  int64_t groups = 0;                     // FSDP groups or DDP buckets
};

std::vector<float> flat_grads(nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> g = to_vector<float>(p.grad());
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// kSteps AdamW steps of a small GPT on `world` rank threads, each rank's rows of the global
// batch (testing::kFsdpBatch rows) in `micro` micro-batches.
Trained train(Parallel parallel, Sync sync, int world, int micro) {
  Trained run;
  run.grads.resize(kSteps);
  run.grad_collectives.assign(kSteps, 0);
  std::vector<std::vector<float>> losses(world);
  uint64_t after = 0;
  for (const fr::Entry& e : fr::FlightRecorder::global().snapshot()) {
    after = std::max(after, e.record_id);
  }
  const fr::OpType grad_op =
      parallel == Parallel::kFsdp ? fr::OpType::kReduceScatter : fr::OpType::kAllReduce;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {world}, {"dp"});
    nn::GPT model(testing::fsdp_gpt_config());
    std::optional<DDPModule> ddp;
    FSDPModule* root = nullptr;
    if (parallel == Parallel::kDdp) {
      ddp.emplace(replicate(model, mesh));
    } else {
      auto& blocks = model.submodule("transformer.h");
      for (int64_t i = 0; i < model.config().n_layer; ++i) {
        fully_shard(blocks.child(std::to_string(i)), mesh);
      }
      root = &fully_shard(model, mesh);
    }
    nn::optim::AdamW opt(model.parameters(), {.lr = 1e-2});
    const int64_t rows = testing::kFsdpBatch / world;
    const int64_t micro_rows = rows / micro;
    // Collectives of the set-up (DDP's model check and broadcast) are not the steps'.
    Tensor barrier = from_vector<float>({0.0f});
    pg.all_reduce(barrier);
    if (pg.rank() == 0) {
      for (const fr::Entry& e : fr::FlightRecorder::global().snapshot()) {
        after = std::max(after, e.record_id);
      }
    }
    pg.all_reduce(barrier);
    for (int step = 0; step < kSteps; ++step) {
      const auto [x, y] = testing::fsdp_batch_of(step);
      double loss_sum = 0;
      for (int m = 0; m < micro; ++m) {
        const bool on = sync == Sync::kEvery || m + 1 == micro;
        if (root) root->set_requires_gradient_sync(on);
        if (ddp) ddp->set_requires_gradient_sync(on);
        const int64_t start = pg.rank() * rows + m * micro_rows;
        const Tensor loss = div(
            nn::GPT::loss(model(narrow(x, 0, start, micro_rows)), narrow(y, 0, start, micro_rows)),
            static_cast<double>(micro));
        backward(loss);
        loss_sum += item(loss);
      }
      if (pg.rank() == 0) run.grads[step] = flat_grads(model);
      opt.step();
      opt.zero_grad();
      Tensor mean = from_vector<float>({static_cast<float>(loss_sum)});
      pg.all_reduce(mean, {.op = ReduceOp::kAvg});  // every rank's backward of the step is done
      losses[pg.rank()].push_back(item(mean));
      // Rank 0 counts the step's gradient collectives of every rank (one recorder per process;
      // FSDP's may be recorded on autograd's threads, which carry no step), then a barrier.
      if (pg.rank() == 0) {
        for (const fr::Entry& e : fr::FlightRecorder::global().snapshot()) {
          if (e.record_id <= after) continue;
          after = std::max(after, e.record_id);
          if (e.op == grad_op && e.input.numel > 1) ++run.grad_collectives[step];  // not losses
        }
      }
      pg.all_reduce(barrier);
    }
    if (pg.rank() == 0) {
      run.groups = ddp ? static_cast<int64_t>(ddp->buckets().size()) : model.config().n_layer + 1;
    }
  });
  run.losses = losses[0];
  return run;
}

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class GradAccumTest
    : public ::testing::TestWithParam<std::tuple<Parallel, Sync, int /*world*/, int /*micro*/>> {};

TEST_P(GradAccumTest, MicroBatchesEqualTheWholeBatch) {
  const auto [parallel, sync, world, micro] = GetParam();
  const Trained whole = train(parallel, Sync::kLast, world, 1);
  const Trained accumulated = train(parallel, sync, world, micro);
  ASSERT_EQ(accumulated.losses.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(accumulated.losses[s], whole.losses[s], kTolerance * whole.losses[s])
        << "step " << s;
    ASSERT_EQ(accumulated.grads[s].size(), whole.grads[s].size());
    EXPECT_LT(relative_diff(accumulated.grads[s], whole.grads[s]), kTolerance) << "step " << s;
  }
  // The collectives of each step: with sync on the last micro-batch, as many as one step on
  // the whole batch (one reduce_scatter per FSDP group, one all_reduce per DDP bucket, on every
  // rank); with sync on every micro-batch, `micro` times as many. A world of 1 communicates
  // nothing under DDP.
  const int64_t per_step = parallel == Parallel::kDdp && world == 1 ? 0 : whole.groups * world;
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(whole.grad_collectives[s], per_step) << "step " << s;
    EXPECT_EQ(accumulated.grad_collectives[s], sync == Sync::kLast ? per_step : per_step * micro)
        << "step " << s;
  }
}

std::string case_name(const ::testing::TestParamInfo<GradAccumTest::ParamType>& info) {
  const auto [parallel, sync, world, micro] = info.param;
  return std::string(parallel == Parallel::kFsdp ? "Fsdp" : "Ddp") +
         (sync == Sync::kLast ? "SyncLast" : "SyncEvery") + "_World" + std::to_string(world) +
         "_Micro" + std::to_string(micro);
}

INSTANTIATE_TEST_SUITE_P(All, GradAccumTest,
                         ::testing::Values(std::tuple{Parallel::kFsdp, Sync::kLast, 3, 4},
                                           std::tuple{Parallel::kFsdp, Sync::kEvery, 3, 4},
                                           std::tuple{Parallel::kFsdp, Sync::kLast, 2, 3},
                                           std::tuple{Parallel::kFsdp, Sync::kLast, 1, 4},
                                           std::tuple{Parallel::kDdp, Sync::kLast, 3, 4},
                                           std::tuple{Parallel::kDdp, Sync::kEvery, 3, 4},
                                           std::tuple{Parallel::kDdp, Sync::kLast, 2, 3}),
                         case_name);

}  // namespace
}  // namespace tessel
