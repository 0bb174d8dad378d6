// Tensor parallelism of the GPT on rank threads against single-process training: the loss of
// every step over 20 AdamW steps and every parameter's gradient of the first step, for tp 2 and
// 4 (4 heads) with and without sequence parallelism, with FSDP on (dp_shard, tp) and HSDP on
// (dp_replicate, dp_shard, tp) (tolerances in tp_checks.h: 1e-5 relative for the losses, 1e-5
// of each gradient's largest entry); the placements FSDP records on the joined mesh;
// meta-device construction; state dicts that load into a single-process model.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/fsdp/state_dict.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/tp_checks.h"

namespace tessel {
namespace {

using testing::TpRun;
using testing::TpSetup;

const TpRun& single() {
  static const TpRun run = testing::train_single_process(20);
  return run;
}

// Rank 0's run of `setup` on rank threads against single-process training.
void expect_parity(const TpSetup& setup) {
  const TpRun got = testing::train_tensor_parallel_threads(setup);
  const std::string error = testing::parity_error(got, single());
  EXPECT_TRUE(error.empty()) << error;
}

TEST(TpParityTest, TensorParallelTwoAndFourMatchSingleProcess) {
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    expect_parity({{tp}, {"tp"}});
  }
}

TEST(TpParityTest, SequenceParallelTwoAndFourMatchSingleProcess) {
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    expect_parity({{tp}, {"tp"}, /*sequence_parallel=*/true});
  }
  SCOPED_TRACE("overlapped all_gathers");
  expect_parity({{2}, {"tp"}, true, /*overlap_chunks=*/2});
}

TEST(TpParityTest, FsdpTimesTensorParallelMatchesSingleProcess) {
  expect_parity({{2, 2}, {"dp_shard", "tp"}});
  SCOPED_TRACE("sequence parallel");
  expect_parity({{2, 2}, {"dp_shard", "tp"}, true});
}

TEST(TpParityTest, HsdpTimesTensorParallelOnEightRanksMatchesSingleProcess) {
  expect_parity({{2, 2, 2}, {"dp_replicate", "dp_shard", "tp"}});
  SCOPED_TRACE("sequence parallel");
  expect_parity({{2, 2, 2}, {"dp_replicate", "dp_shard", "tp"}, true});
}

TEST(TpFsdpStateTest, PlacementsShowBothDimensionsAndMetaModelsInitialiseLikeTheWhole) {
  const nn::GptConfig kConfig = testing::tp_gpt_config();
  nn::GPT reference(kConfig);
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp_shard", "tp"});
    std::unique_ptr<nn::GPT> model;
    {
      DefaultDeviceGuard meta(Device::meta());
      model = std::make_unique<nn::GPT>(kConfig);
    }
    parallelize_module(*model, mesh["tp"], gpt_tp_plan({.sequence_parallel = true}));
    for (int i = 0; i < kConfig.n_layer; ++i) {
      fully_shard(model->submodule("transformer.h").child(std::to_string(i)), mesh["dp_shard"]);
    }
    fully_shard(*model, mesh["dp_shard"]);
    model->to_empty(Device::cpu());
    model->init_weights();

    const DTensor fc = as_dtensor(model->parameter("transformer.h.0.mlp.c_fc.weight"));
    EXPECT_EQ(fc.mesh(), mesh);
    EXPECT_EQ(fc.placements(), (std::vector<Placement>{Shard{0}, Shard{0}}));
    EXPECT_EQ(fc.spec().shard_order(), (std::vector<int64_t>{1, 0}));  // tp splits first
    EXPECT_EQ(fc.local_shape(), (Shape{32, 32}));                      // 128 rows / 2 / 2
    const DTensor proj = as_dtensor(model->parameter("transformer.h.1.attn.c_proj.weight"));
    EXPECT_EQ(proj.placements(), (std::vector<Placement>{Shard{0}, Shard{1}}));
    const DTensor qkv = as_dtensor(model->parameter("transformer.h.0.attn.c_attn.weight"));
    EXPECT_EQ(qkv.global_shape(), (Shape{3, 32, 32}));
    EXPECT_EQ(qkv.placements(), (std::vector<Placement>{Shard{0}, Shard{1}}));
    const DTensor norm = as_dtensor(model->parameter("transformer.ln_f.weight"));
    EXPECT_EQ(norm.placements(), (std::vector<Placement>{Shard{0}, Replicate{}}));
    const DTensor wte = as_dtensor(model->parameter("transformer.wte.weight"));
    EXPECT_EQ(wte.global_shape(), (Shape{66, 32}));  // 33 rows per tp rank, 17 / 16 per dp

    // Initialised like the whole model, and its full state dict loads into one.
    const nn::StateDict full = full_state_dict(*model, /*rank0_only=*/false);
    for (auto& [name, t] : reference.named_parameters()) {
      ASSERT_TRUE(full.count(name)) << name;
      EXPECT_EQ(to_vector<float>(full.at(name)), to_vector<float>(t)) << name;
    }
    nn::GPT whole(kConfig);
    whole.load_state_dict(full);
    EXPECT_TRUE(full_state_dict(*model, /*rank0_only=*/true).empty() == (pg.rank() != 0));
  });
}

}  // namespace
}  // namespace tessel
