// fully_shard on rank threads: loss parity with single-process training (worlds 1-4, uneven
// shards, HSDP, ZeRO-2, N-way reshard, mixed precision with and without autocast, gradient
// accumulation), meta-device construction, state dicts, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/fsdp.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

const nn::GptConfig kConfig{.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2,
                            .n_embd = 30, .seed = 3};  // 30: rows that 4 ranks split unevenly
constexpr int64_t kBatch = 12;  // global batch (sequences); every world size here divides it
constexpr int kSteps = 20;

// The global batch of step `step`: inputs and next-token targets, the same on every rank.
// Sequences count up in steps of 3 from a random start, so the loss has something to learn
// (on random tokens it would stay at ln 64 and hide differences).
std::pair<Tensor, Tensor> batch_of(int step) {
  Generator gen(100 + step);
  const Tensor start = to(mul(rand({kBatch, 1}, gen), 64.0), DType::kI64);
  const Tensor steps = mul(arange(kConfig.block_size + 1), 3.0);
  Tensor tokens = contiguous(add(start, unsqueeze(steps, 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= 64;
  return {narrow(tokens, 1, 0, kConfig.block_size), narrow(tokens, 1, 1, kConfig.block_size)};
}

nn::optim::AdamWOptions adamw() { return {.lr = 1e-2, .weight_decay = 0.1}; }

// Losses of plain single-process training on the global batches (micro: that many backward
// passes per step, each on a slice, gradients summed).
std::vector<float> train_single(int micro = 1) {
  nn::GPT model(kConfig);
  nn::optim::AdamW opt(model.parameters(), adamw());
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch_of(step);
    double total = 0;
    for (int m = 0; m < micro; ++m) {
      const int64_t rows = kBatch / micro;
      const Tensor loss = nn::GPT::loss(model(narrow(x, 0, m * rows, rows)), narrow(y, 0, m * rows, rows));
      backward(loss);
      total += item(loss) / micro;
    }
    nn::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    losses.push_back(static_cast<float>(total));
  }
  return losses;
}

struct FsdpSetup {
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_names;
  FullyShardOptions options;
  int micro = 1;          // backward passes per step (sync only on the last)
  bool hsdp_accumulate = false;  // HSDP: skip the replicas' all_reduce on all but the last
  bool autocast = false;         // forward and loss under AutocastGuard(DType::kBF16)
};

// Losses of the same training under FSDP on rank threads (the mean over ranks of each rank's
// loss on its slice of the batch).
std::vector<float> train_fsdp(const FsdpSetup& s) {
  int world = 1;
  for (int64_t n : s.mesh_shape) world *= static_cast<int>(n);
  std::vector<float> losses(kSteps);
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), s.mesh_shape, s.mesh_names);
    nn::GPT model(kConfig);
    auto& blocks = model.submodule("transformer.h");
    for (size_t i = 0; i < static_cast<size_t>(kConfig.n_layer); ++i) {
      fully_shard(blocks.child(std::to_string(i)), mesh, s.options);
    }
    FSDPModule& root = fully_shard(model, mesh, s.options);
    nn::optim::AdamW opt(model.parameters(), adamw());
    const int64_t per_rank = kBatch / world;
    for (int step = 0; step < kSteps; ++step) {
      const auto [x, y] = batch_of(step);
      double total = 0;
      for (int m = 0; m < s.micro; ++m) {
        const bool last = m + 1 == s.micro;
        if (s.hsdp_accumulate) {
          root.set_requires_all_reduce(last);
        } else {
          root.set_requires_gradient_sync(last);
        }
        const int64_t rows = per_rank / s.micro;
        const int64_t start = pg.rank() * per_rank + m * rows;
        Tensor loss;
        {
          std::optional<AutocastGuard> autocast;
          if (s.autocast) autocast.emplace(DType::kBF16);
          loss = nn::GPT::loss(model(narrow(x, 0, start, rows)), narrow(y, 0, start, rows));
        }
        backward(loss);
        total += item(loss) / s.micro;
      }
      clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
      Tensor mean = from_vector<float>({static_cast<float>(total)});
      pg.all_reduce(mean, {.op = ReduceOp::kAvg});
      if (pg.rank() == 0) losses[step] = mean.data<float>()[0];
    }
  });
  return losses;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << "step " << i;
  }
}

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
  mp.mp_policy = {.param_dtype = DType::kBF16, .reduce_dtype = DType::kF32,
                  .output_dtype = DType::kF32};
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
