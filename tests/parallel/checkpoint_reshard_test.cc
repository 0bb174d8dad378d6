// Resharding loads on rank threads: a random sweep of DTensor layouts (1-D to 3-D meshes over 1
// to 6 ranks, Shard/Replicate placements in random shard orders, uneven, empty and zero-sized
// shards, four dtypes) saved on one world and loaded on another, bit for bit; and GPT training
// under FSDP resumed from a checkpoint on the same mesh (bitwise), on fewer ranks, on HSDP and
// in one process (within 1e-5 of the uninterrupted run).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointState;
using Rng = std::mt19937_64;

using testing::TempDir;

int64_t uniform(Rng& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// --- Random layouts ----------------------------------------------------------------------------

struct Layout {
  std::vector<int64_t> mesh_shape;
  std::vector<Placement> placements;
  std::vector<int64_t> order;
};

struct TensorCase {
  Shape shape;
  DType dtype;
  Layout saved, loaded;
};

struct Case {
  int save_world, load_world;
  std::vector<TensorCase> tensors;
};

std::vector<int64_t> random_mesh(Rng& rng, int64_t world) {
  std::vector<std::vector<int64_t>> shapes = {{world}};
  for (int64_t a = 1; a <= world; ++a) {
    if (world % a) continue;
    shapes.push_back({a, world / a});
    for (int64_t b = 1; b <= world / a; ++b) {
      if ((world / a) % b == 0) shapes.push_back({a, b, world / a / b});
    }
  }
  return shapes[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(shapes.size()) - 1))];
}

Layout random_layout(Rng& rng, int64_t world, size_t ndim) {
  Layout l;
  l.mesh_shape = random_mesh(rng, world);
  for (size_t m = 0; m < l.mesh_shape.size(); ++m) {
    if (ndim == 0 || uniform(rng, 0, 2) == 0) {
      l.placements.push_back(Replicate{});
    } else {
      l.placements.push_back(Shard{uniform(rng, 0, static_cast<int64_t>(ndim) - 1)});
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(l.mesh_shape.size()); ++i) l.order.push_back(i);
  std::shuffle(l.order.begin(), l.order.end(), rng);
  return l;
}

std::vector<Case> random_cases(uint64_t seed, int count) {
  Rng rng(seed);
  const std::vector<int> worlds = {1, 2, 3, 4, 6};
  const std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kI64, DType::kI32};
  std::vector<Case> cases;
  for (int c = 0; c < count; ++c) {
    Case k{worlds[uniform(rng, 0, 4)], worlds[uniform(rng, 0, 4)], {}};
    for (int t = 0; t < 3; ++t) {
      TensorCase tc;
      const int64_t ndim = uniform(rng, 0, 3);
      for (int64_t d = 0; d < ndim; ++d) tc.shape.push_back(uniform(rng, 0, 9));
      if (uniform(rng, 0, 5) == 0 && ndim > 0) tc.shape[0] = 0;
      tc.dtype = dtypes[uniform(rng, 0, 3)];
      tc.saved = random_layout(rng, k.save_world, tc.shape.size());
      tc.loaded = random_layout(rng, k.load_world, tc.shape.size());
      k.tensors.push_back(std::move(tc));
    }
    cases.push_back(std::move(k));
  }
  return cases;
}

std::string layout_str(const Layout& l) {
  return fmt::format("mesh {} placements {} order {}", shape_str(l.mesh_shape),
                     placements_str(l.placements), shape_str(l.order));
}

// Small integers, exact in every dtype, different for each tensor.
Tensor reference(const TensorCase& t, int index) {
  std::vector<float> v(static_cast<size_t>(shape_numel(t.shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7 + 13 * index) % 200) - 100;
  return to(from_vector<float>(v, t.shape), t.dtype);
}

DTensor place(const Tensor& full, ProcessGroup& pg, const Layout& l) {
  std::vector<std::string> names;
  for (size_t m = 0; m < l.mesh_shape.size(); ++m) names.push_back(fmt::format("d{}", m));
  const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), l.mesh_shape, names);
  return distribute_tensor(full, mesh, l.placements, {.shard_order = l.order});
}

// Each case: saved on one world, loaded on another with other layouts; every rank's local
// tensor must equal its box of the reference. Then once more into one process, whole.
TEST(CheckpointReshardTest, RandomLayoutsReshardBitForBit) {
  TempDir dir;
  const std::vector<Case> cases = random_cases(2024, 40);
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    std::string what = fmt::format("case {}: world {} -> {}", c, k.save_world, k.load_world);
    for (const TensorCase& t : k.tensors) {
      what += fmt::format("\n  {} saved {} loaded {}", typed_shape_str(t.dtype, t.shape),
                          layout_str(t.saved), layout_str(t.loaded));
    }
    SCOPED_TRACE(what);
    const std::string path = dir / fmt::format("case{}", c);
    threads::run_ranks(k.save_world, [&](ProcessGroup& pg) {
      CheckpointState state(pg.shared_from_this());
      for (size_t i = 0; i < k.tensors.size(); ++i) {
        const TensorCase& t = k.tensors[i];
        state.add_tensor(fmt::format("t{}", i),
                         place(reference(t, static_cast<int>(i)), pg, t.saved));
      }
      checkpoint::save(state, path);
    });
    threads::run_ranks(k.load_world, [&](ProcessGroup& pg) {
      CheckpointState state(pg.shared_from_this());
      std::vector<DTensor> targets;
      for (size_t i = 0; i < k.tensors.size(); ++i) {
        const TensorCase& t = k.tensors[i];
        targets.push_back(place(full(t.shape, -1.0, t.dtype), pg, t.loaded));
        state.add_tensor(fmt::format("t{}", i), targets.back());
      }
      checkpoint::load(state, path);
      for (size_t i = 0; i < k.tensors.size(); ++i) {
        Tensor want = reference(k.tensors[i], static_cast<int>(i));
        const Shape offset = targets[i].local_offset();
        for (size_t d = 0; d < offset.size(); ++d) {
          want = narrow(want, static_cast<int64_t>(d), offset[d], targets[i].local_shape()[d]);
        }
        EXPECT_EQ(to_vector<float>(to(targets[i].to_local(), DType::kF32)),
                  to_vector<float>(to(want, DType::kF32)))
            << "tensor " << i << " on rank " << pg.rank();
      }
    });
    CheckpointState one;
    std::vector<Tensor> wholes;
    for (size_t i = 0; i < k.tensors.size(); ++i) {
      wholes.push_back(full(k.tensors[i].shape, -1.0, k.tensors[i].dtype));
      one.add_tensor(fmt::format("t{}", i), wholes.back());
    }
    checkpoint::load(one, path);
    for (size_t i = 0; i < k.tensors.size(); ++i) {
      EXPECT_EQ(to_vector<float>(to(wholes[i], DType::kF32)),
                to_vector<float>(to(reference(k.tensors[i], static_cast<int>(i)), DType::kF32)));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// --- GPT training resumed from a checkpoint ----------------------------------------------------

const nn::GptConfig kConfig{.vocab_size = 64,
                            .block_size = 16,
                            .n_layer = 2,
                            .n_head = 2,
                            .n_embd = 30,
                            .seed = 3};  // 30: rows that 4 ranks split unevenly
constexpr int64_t kBatch = 12;           // global batch: every world size here divides it
constexpr int kSteps = 8;
constexpr int kSaveAt = 4;

// The global batch drawn from `data` (the same on every rank): counting sequences from a random
// start, so the loss has something to learn.
std::pair<Tensor, Tensor> next_batch(Generator& data) {
  const Tensor start = to(mul(rand({kBatch, 1}, data), 64.0), DType::kI64);
  Tensor tokens = contiguous(add(start, unsqueeze(mul(arange(kConfig.block_size + 1), 3.0), 0)));
  int64_t* t = tokens.data<int64_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) t[i] %= 64;
  return {narrow(tokens, 1, 0, kConfig.block_size), narrow(tokens, 1, 1, kConfig.block_size)};
}

struct Run {
  std::vector<int64_t> mesh_shape;  // empty: one process, no FSDP
  std::vector<std::string> names;
  int world() const {
    int n = 1;
    for (int64_t s : mesh_shape) n *= static_cast<int>(s);
    return n;
  }
};

// Trains to kSteps: from scratch, or from the checkpoint `load_from`; saves at kSaveAt into
// `save_to` when given. Returns the loss of each step run (NaN for steps not run).
std::vector<float> train(const Run& run, const std::string& load_from, const std::string& save_to) {
  std::vector<float> losses(kSteps, std::nanf(""));
  auto body = [&](ProcessGroup* pg) {
    std::unique_ptr<nn::GPT> model;
    if (pg != nullptr) {
      const DeviceMesh mesh = init_device_mesh(pg->shared_from_this(), run.mesh_shape, run.names);
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
    } else {
      model = std::make_unique<nn::GPT>(kConfig);
    }
    nn::optim::AdamW opt(model->parameters(), {.lr = 1e-2, .weight_decay = 0.1});
    Generator data(100);
    CheckpointState state(pg ? pg->shared_from_this() : nullptr);
    state.add_tensors("model", model->state_dict());
    state.add_optimizer("optim", opt, *model);
    state.add_generator("data", data);
    if (!load_from.empty()) checkpoint::load(state, load_from);
    const int world = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
    const int64_t rows = kBatch / world;
    for (int64_t step = state.step; step < kSteps; ++step) {
      const auto [x, y] = next_batch(data);
      const Tensor loss =
          nn::GPT::loss((*model)(narrow(x, 0, rank * rows, rows)), narrow(y, 0, rank * rows, rows));
      backward(loss);
      if (pg) {
        clip_grad_norm(model->parameters(), 1.0);
      } else {
        nn::optim::clip_grad_norm(model->parameters(), 1.0);
      }
      opt.step();
      opt.zero_grad();
      Tensor mean = from_vector<float>({static_cast<float>(item(loss))});
      if (pg) pg->all_reduce(mean, {.op = ReduceOp::kAvg});
      if (rank == 0) losses[step] = mean.data<float>()[0];
      if (step + 1 == kSaveAt && !save_to.empty()) {
        state.step = step + 1;
        checkpoint::save(state, save_to);
      }
    }
  };
  if (run.mesh_shape.empty()) {
    body(nullptr);
  } else {
    threads::run_ranks(run.world(), [&](ProcessGroup& pg) { body(&pg); });
  }
  return losses;
}

std::vector<float> tail(const std::vector<float>& v) { return {v.begin() + kSaveAt, v.end()}; }

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << "step " << kSaveAt + i;
  }
}

const Run kFsdp4{{4}, {"dp"}};

TEST(CheckpointResumeTest, SameMeshContinuesBitForBit) {
  TempDir dir;
  const std::vector<float> whole = train(kFsdp4, "", dir / "c");
  EXPECT_EQ(tail(train(kFsdp4, dir / "c", "")), tail(whole));
  const std::vector<float> one = train({}, "", dir / "one");
  EXPECT_EQ(tail(train({}, dir / "one", "")), tail(one));
}

// Another world size reorders the float sums of the reductions: 1e-5 relative, as FSDP's own
// parity tests allow.
TEST(CheckpointResumeTest, OtherMeshesResumeWithinTolerance) {
  TempDir dir;
  const std::vector<float> whole = train(kFsdp4, "", dir / "c");
  expect_close(tail(train({{2}, {"dp"}}, dir / "c", "")), tail(whole), 1e-5);
  expect_close(tail(train({{2, 2}, {"replicate", "shard"}}, dir / "c", "")), tail(whole), 1e-5);
  expect_close(tail(train({}, dir / "c", "")), tail(whole), 1e-5);
  // And back: saved by one process, resumed on 3 ranks (uneven shards).
  const std::vector<float> one = train({}, "", dir / "one");
  expect_close(tail(train({{3}, {"dp"}}, dir / "one", "")), tail(one), 1e-5);
}

}  // namespace
}  // namespace tessel
