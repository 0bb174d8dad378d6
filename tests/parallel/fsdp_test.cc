// fully_shard on rank threads: loss parity with single-process training (worlds 1-4, uneven
// shards, HSDP, ZeRO-2, N-way reshard, mixed precision with and without autocast, gradient
// accumulation), meta-device construction, state dicts, and bad input.
#include "tessel/parallel/fsdp/fsdp.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/state_dict.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/fsdp_checks.h"

namespace tessel {
namespace {

using testing::expect_close;
using testing::FsdpSetup;
using testing::train_fsdp;
using testing::train_single;

const nn::GptConfig kConfig = testing::fsdp_gpt_config();

TEST(FsdpParityTest, OneRankIsBitwiseSingleProcess) {
  EXPECT_EQ(train_fsdp({{1}, {"dp"}, {}}), train_single());
}

// Averages over ranks reorder float sums: 1e-5 relative over 20 AdamW steps.
TEST(FsdpParityTest, WorldsTwoThreeAndFourMatchSingleProcess) {
  const std::vector<float> single = train_single();
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    expect_close(train_fsdp({{world}, {"dp"}, {}}), single, 1e-5);
  }
}

TEST(FsdpParityTest, HsdpTwoByTwoMatchesSingleProcess) {
  expect_close(train_fsdp({{2, 2}, {"replicate", "shard"}, {}}), train_single(), 1e-5);
}

TEST(FsdpParityTest, ZeroTwoAndTwoWayReshardMatchSingleProcess) {
  const std::vector<float> single = train_single();
  FullyShardOptions zero2;
  zero2.reshard_after_forward = false;
  expect_close(train_fsdp({{4}, {"dp"}, zero2}), single, 1e-5);
  FullyShardOptions two_way;
  two_way.reshard_after_forward = int64_t{2};
  expect_close(train_fsdp({{4}, {"dp"}, two_way}), single, 1e-5);
}

TEST(FsdpParityTest, GradientAccumulationMatchesSingleProcess) {
  const std::vector<float> single = train_single(/*micro=*/2);
  expect_close(train_fsdp({{2}, {"dp"}, {}, /*micro=*/2}), single, 1e-5);
  FsdpSetup hsdp{{2, 2}, {"replicate", "shard"}, {}, /*micro=*/3};
  hsdp.hsdp_accumulate = true;
  expect_close(train_fsdp(hsdp), train_single(/*micro=*/3), 1e-5);
}

// bf16 parameters and activations with f32 gradients and master weights: within bf16's
// precision of f32 single-process training.
TEST(FsdpParityTest, MixedPrecisionStaysCloseToF32) {
  FullyShardOptions mp;
  mp.mp_policy = {
      .param_dtype = DType::kBF16, .reduce_dtype = DType::kF32, .output_dtype = DType::kF32};
  expect_close(train_fsdp({{2}, {"dp"}, mp}), train_single(), 3e-2);
}

// Autocast chooses compute dtypes, FSDP's policy the parameters' dtype: under autocast with f32
// parameters (each GEMM casts its weight) and with bf16 ones (the casts are no-ops, the norms
// still widen to f32), training stays within bf16's precision of f32 training.
TEST(FsdpParityTest, AutocastComposesWithMixedPrecision) {
  const std::vector<float> single = train_single();
  FsdpSetup f32_params{{2}, {"dp"}, {}};
  f32_params.autocast = true;
  expect_close(train_fsdp(f32_params), single, 3e-2);
  FsdpSetup bf16_params{{2}, {"dp"}, {}};
  bf16_params.options.mp_policy = {.param_dtype = DType::kBF16, .reduce_dtype = DType::kF32};
  bf16_params.autocast = true;
  expect_close(train_fsdp(bf16_params), single, 3e-2);
}

TEST(FsdpStateTest, MetaConstructionMaterialisesShardsInitialisedLikeTheWhole) {
  nn::GPT reference(kConfig);
  threads::run_ranks(3, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {3}, {"dp"});
    std::unique_ptr<nn::GPT> model;
    {
      DefaultDeviceGuard meta(Device::meta());
      model = std::make_unique<nn::GPT>(kConfig);
    }
    for (int i = 0; i < kConfig.n_layer; ++i) {
      fully_shard(model->submodule("transformer.h").child(std::to_string(i)), mesh);
    }
    fully_shard(*model, mesh);
    model->to_empty(Device::cpu());
    model->init_weights();
    int64_t local = 0, whole = 0;
    for (const Tensor& p : model->parameters()) {
      ASSERT_TRUE(is_dtensor(p));
      local += p.numel();
      whole += shape_numel(as_dtensor(p).global_shape());
    }
    EXPECT_LT(local, whole / 3 + 200);  // only the shards exist
    const nn::StateDict full = full_state_dict(*model, /*rank0_only=*/false);
    for (auto& [name, t] : reference.named_parameters()) {
      ASSERT_TRUE(full.count(name)) << name;
      EXPECT_EQ(to_vector<float>(full.at(name)), to_vector<float>(t)) << name;
    }
    const auto sharded = sharded_state_dict(*model, mesh);
    EXPECT_EQ(sharded.size(), reference.named_parameters().size());
    EXPECT_EQ(sharded[0].second.placements(), (std::vector<Placement>{Shard{0}}));
  });
}

TEST(FsdpErrorTest, RanksThatDisagreeOnTheModelFailWithOneMessage) {
  std::vector<std::string> messages(3);
  threads::run_ranks(3, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {3}, {"dp"});
    nn::GptConfig c = kConfig;
    if (pg.rank() == 2) c.n_embd = 32;  // rank 2 builds a wider model
    nn::GPT model(c);
    fully_shard(model, mesh);
    try {
      model(zeros({1, 4}, DType::kI64));
      messages[pg.rank()] = "no error";
    } catch (const InvalidArgument& e) {
      messages[pg.rank()] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_EQ(m, messages[0]);
    EXPECT_NE(m.find("sharded parameter #0 is 'GPT:transformer.wte.weight f32[64, 30]' on rank "
                     "0 but 'GPT:transformer.wte.weight f32[64, 32]' on rank 2"),
              std::string::npos)
        << m;
  }
}

TEST(FsdpErrorTest, BadCallsAreRefused) {
  threads::run_ranks(2, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
    nn::GPT model(kConfig);
    fully_shard(model, mesh);
    EXPECT_THROW(fully_shard(model, mesh), InvalidArgument);  // twice
    nn::GPT other(kConfig);
    FullyShardOptions wrong_dim;
    wrong_dim.shard_dim = "tp";
    EXPECT_THROW(fully_shard(other, mesh, wrong_dim), InvalidArgument);
    FullyShardOptions three_way;
    three_way.reshard_after_forward = int64_t{3};
    EXPECT_THROW(fully_shard(other, mesh, three_way), InvalidArgument);
  });
}

}  // namespace
}  // namespace tessel
