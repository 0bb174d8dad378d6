// Tensor parallelism of the GPT on rank threads against single-process training: the loss of
// every step over 20 AdamW steps and every parameter's gradient of the first step, for tp 2 and
// 4 (4 heads) with and without sequence parallelism, with FSDP on (dp_shard, tp) and HSDP on
// (dp_replicate, dp_shard, tp); the placements FSDP records on the joined mesh; meta-device
// construction; state dicts that load into a single-process model.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/fsdp.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

// 66 tokens: the vocabulary splits unevenly over 4 ranks (17, 17, 17, 15) and again under FSDP.
const nn::GptConfig kConfig{.vocab_size = 66, .block_size = 16, .n_layer = 2, .n_head = 4,
                            .n_embd = 32, .seed = 3};
constexpr int64_t kBatch = 8;  // global batch (sequences); every dp size here divides it
constexpr int kSteps = 20;

// The global batch of step `step`, the same on every rank: sequences that count up in steps of
// 5 from a random start, so the loss falls (on random tokens it stays at ln V and hides bugs).
std::pair<Tensor, Tensor> batch_of(int step) {
  const int64_t V = kConfig.vocab_size;
  Generator gen(200 + step);
  const Tensor start = to(mul(rand({kBatch, 1}, gen), static_cast<double>(V)), DType::kI64);
  Tensor tokens = contiguous(add(start, unsqueeze(mul(arange(kConfig.block_size + 1), 5.0), 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= V;
  return {narrow(tokens, 1, 0, kConfig.block_size), narrow(tokens, 1, 1, kConfig.block_size)};
}

nn::optim::AdamWOptions adamw() { return {.lr = 1e-2, .weight_decay = 0.1}; }

struct Run {
  std::vector<float> losses;
  std::map<std::string, Tensor> first_grads;  // the whole gradient of step 0, by name
};

Run train_single() {
  nn::GPT model(kConfig);
  nn::optim::AdamW opt(model.parameters(), adamw());
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch_of(step);
    const Tensor loss = nn::GPT::loss(model(x), y);
    backward(loss);
    if (step == 0) {
      for (auto& [name, p] : model.named_parameters()) run.first_grads[name] = clone(p.grad());
    }
    nn::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    run.losses.push_back(static_cast<float>(item(loss)));
  }
  return run;
}

const Run& single() {
  static const Run run = train_single();
  return run;
}

struct Setup {
  std::vector<int64_t> shape;       // of the mesh
  std::vector<std::string> names;   // "tp" last; dp_shard / dp_replicate before it
  bool sequence_parallel = false;
  int64_t overlap_chunks = 0;
};

// The whole gradient of parameter p, gathered over its mesh when it is a DTensor (collective).
Tensor whole_grad(const Tensor& p, const Shape& shape) {
  if (!is_dtensor(p)) return clone(p.grad());
  return clone(reshape(DTensor(p.grad(), as_dtensor(p).spec()).full_tensor(), shape));
}

Run train_parallel(const Setup& s) {
  int world = 1;
  for (int64_t n : s.shape) world *= static_cast<int>(n);
  const nn::GPT shapes(kConfig);  // parameter shapes of the whole model
  Run run;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), s.shape, s.names);
    nn::GPT model(kConfig);
    parallelize_module(model, mesh["tp"],
                       gpt_tp_plan({.sequence_parallel = s.sequence_parallel,
                                    .overlap_chunks = s.overlap_chunks}));
    std::vector<std::string> dp_dims(s.names.begin(), s.names.end() - 1);
    int64_t dp_size = 1, dp_rank = 0;
    if (!dp_dims.empty()) {
      const DeviceMesh dp = mesh.slice(dp_dims);
      for (size_t i = 0; i < static_cast<size_t>(kConfig.n_layer); ++i) {
        fully_shard(model.submodule("transformer.h").child(std::to_string(i)), dp);
      }
      fully_shard(model, dp);
      for (const std::string& d : dp_dims) {
        dp_rank = dp_rank * mesh.size(d) + mesh.local_rank(d);
        dp_size *= mesh.size(d);
      }
    }
    nn::optim::AdamW opt(model.parameters(), adamw());
    const int64_t rows = kBatch / dp_size;
    for (int step = 0; step < kSteps; ++step) {
      const auto [x, y] = batch_of(step);
      const Tensor logits = model(narrow(x, 0, dp_rank * rows, rows));
      const Tensor loss = loss_parallel_cross_entropy(logits, narrow(y, 0, dp_rank * rows, rows),
                                                      mesh["tp"], kConfig.vocab_size);
      backward(loss);
      if (step == 0) {
        const auto whole = shapes.state_dict();
        for (auto& [name, p] : model.named_parameters()) {
          const Tensor g = whole_grad(p, whole.at(name).shape());
          if (pg.rank() == 0) run.first_grads[name] = g;
        }
      }
      clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
      Tensor mean = from_vector<float>({static_cast<float>(item(loss))});
      pg.all_reduce(mean, {.op = ReduceOp::kAvg});  // tp ranks agree; dp ranks' slices averaged
      if (pg.rank() == 0) run.losses.push_back(mean.data<float>()[0]);
    }
  });
  return run;
}

// Losses within `loss_rtol` (relative) at every step; first-step gradients within `grad_tol`
// of each tensor's largest entry. Float sums run in other orders (row-parallel partial sums,
// FSDP's averages), so parity is close, not bitwise.
void expect_parity(const Setup& s, double loss_rtol = 1e-5, double grad_tol = 1e-5) {
  const Run got = train_parallel(s);
  const Run& want = single();
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], loss_rtol * std::abs(want.losses[i]))
        << "step " << i;
  }
  EXPECT_LT(want.losses.back(), want.losses.front() - 1.0);  // the data is learnable
  ASSERT_EQ(got.first_grads.size(), want.first_grads.size());
  for (const auto& [name, w] : want.first_grads) {
    ASSERT_TRUE(got.first_grads.count(name)) << name;
    const Tensor& g = got.first_grads.at(name);
    ASSERT_EQ(g.shape(), w.shape()) << name;
    const double scale = item(max(abs(w)));
    const double err = item(max(abs(sub(g, w))));
    EXPECT_LE(err, grad_tol * scale) << name << ": gradient differs by " << err << " (largest "
                                     << scale << ")";
  }
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
    EXPECT_EQ(fc.local_shape(), (Shape{32, 32}));                     // 128 rows / 2 / 2
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
