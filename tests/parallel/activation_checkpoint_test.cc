// Activation checkpointing (nn/activation_checkpoint.h) composed with FSDP, DDP and tensor
// parallelism on 2 rank threads: every rank's losses and local gradients over three AdamW steps
// are bit-identical to the same parallel run without checkpointing (CPU, f32), full and
// selective, with dropout. Under FSDP the recomputation runs after the block's backward
// pre-hook gathered its parameters; under TP it issues the block's forward collectives again.

#include "tessel/nn/activation_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/parallel/tp/parallelize.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/fsdp_checks.h"

namespace tessel {
namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;

enum class Parallel { kFsdp, kDdp, kTp };

// Per rank: every step's loss and local gradients, flattened, as raw f32 values.
using RankTrace = std::vector<std::vector<float>>;

RankTrace append(RankTrace trace, const Tensor& loss, nn::Module& model) {
  std::vector<float> values = to_vector<float>(loss);
  for (const Tensor& p : model.parameters()) {
    if (!p.grad().defined()) continue;
    const std::vector<float> g = to_vector<float>(p.grad());
    values.insert(values.end(), g.begin(), g.end());
  }
  trace.push_back(std::move(values));
  return trace;
}

std::vector<RankTrace> train(Parallel parallel, nn::CheckpointPolicy policy, double dropout) {
  std::vector<RankTrace> traces(kWorld);
  threads::run_ranks(kWorld, [&](ProcessGroup& pg) {
    const std::string dim = parallel == Parallel::kTp ? "tp" : "dp";
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {kWorld}, {dim});
    nn::GptConfig config = testing::fsdp_gpt_config();
    config.dropout = dropout;
    nn::GPT model(config);
    std::optional<DDPModule> ddp;
    if (parallel == Parallel::kTp) parallelize_module(model, mesh[dim], gpt_tp_plan());
    nn::checkpoint_blocks(model, policy);  // before the data-parallel wrappers, as torchtitan
    if (parallel == Parallel::kFsdp) {
      for (int64_t i = 0; i < config.n_layer; ++i) {
        fully_shard(model.submodule("transformer.h").child(std::to_string(i)), mesh);
      }
      fully_shard(model, mesh);
    } else if (parallel == Parallel::kDdp) {
      ddp.emplace(replicate(model, mesh));
    }
    nn::optim::AdamW opt(model.parameters(), {.lr = 1e-2});
    const int rank = pg.rank();
    // Data parallel: each rank its rows; tensor parallel: the whole batch on both.
    const int64_t rows =
        parallel == Parallel::kTp ? testing::kFsdpBatch : testing::kFsdpBatch / kWorld;
    const int64_t first = parallel == Parallel::kTp ? 0 : rank * rows;
    RankTrace trace;
    for (int step = 0; step < kSteps; ++step) {
      const auto [x, y] = testing::fsdp_batch_of(step);
      const Tensor logits = model(narrow(x, 0, first, rows));
      const Tensor targets = narrow(y, 0, first, rows);
      const Tensor loss =
          parallel == Parallel::kTp
              ? loss_parallel_cross_entropy(logits, targets, mesh[dim], config.vocab_size)
              : nn::GPT::loss(logits, targets);
      backward(loss);
      trace = append(std::move(trace), loss, model);
      opt.step();
      opt.zero_grad();
    }
    traces[static_cast<size_t>(rank)] = std::move(trace);
  });
  return traces;
}

class CheckpointParallelTest
    : public ::testing::TestWithParam<std::tuple<Parallel, nn::CheckpointPolicy, double>> {};

TEST_P(CheckpointParallelTest, LossesAndGradientsBitIdenticalToNoCheckpointing) {
  const auto [parallel, policy, dropout] = GetParam();
  const std::vector<RankTrace> want = train(parallel, nn::CheckpointPolicy::kNone, dropout);
  const std::vector<RankTrace> got = train(parallel, policy, dropout);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(got[r].size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      const std::vector<float>& a = got[r][s];
      const std::vector<float>& b = want[r][s];
      ASSERT_EQ(a.size(), b.size()) << "rank " << r << " step " << s;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "rank " << r << " step " << s << ": loss " << a[0] << " vs " << b[0];
    }
  }
}

std::string name_of(Parallel p) {
  return p == Parallel::kFsdp ? "Fsdp" : p == Parallel::kDdp ? "Ddp" : "Tp";
}

INSTANTIATE_TEST_SUITE_P(TwoRanks, CheckpointParallelTest,
                         ::testing::Combine(::testing::Values(Parallel::kFsdp, Parallel::kDdp,
                                                              Parallel::kTp),
                                            ::testing::Values(nn::CheckpointPolicy::kFull,
                                                              nn::CheckpointPolicy::kSelective),
                                            ::testing::Values(0.0, 0.1)),
                         [](const auto& info) {
                           return name_of(std::get<0>(info.param)) + "_" +
                                  std::string(nn::checkpoint_policy_name(std::get<1>(info.param))) +
                                  (std::get<2>(info.param) > 0 ? "_Dropout" : "");
                         });

}  // namespace
}  // namespace tessel
