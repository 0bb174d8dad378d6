// DTensor on rank threads: shard arithmetic, the redistribution planner, the property sweep
// over random meshes, shapes, dtypes and placement pairs, gradients of every differentiable
// entry point against a single-process model, printing, and bad input.
#include "tessel/parallel/dtensor/dtensor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/parallel/dtensor/internal/redistribute_plan.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/dtensor_checks.h"

namespace tessel {
namespace {

using internal::plan_redistribute;
using internal::RedistributeStep;

std::vector<std::string> plan_text(const std::vector<Placement>& src,
                                   const std::vector<Placement>& dst, int64_t ndim,
                                   std::vector<int64_t> src_order = {},
                                   std::vector<int64_t> dst_order = {}) {
  const size_t n = src.size();
  auto order = [n](std::vector<int64_t> o) {
    if (o.empty()) {
      for (size_t i = 0; i < n; ++i) o.push_back(static_cast<int64_t>(i));
    }
    return o;
  };
  std::vector<std::string> out;
  for (const RedistributeStep& s :
       plan_redistribute(src, order(src_order), dst, order(dst_order), ndim)) {
    out.push_back(s.str());
  }
  return out;
}

TEST(ShardArithmeticTest, ChunksFollowTorchChunkWithEmptyTails) {
  EXPECT_EQ(chunk_of(5, 4, 0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(chunk_of(5, 4, 2), (std::pair<int64_t, int64_t>{4, 1}));
  EXPECT_EQ(chunk_of(5, 4, 3), (std::pair<int64_t, int64_t>{5, 0}));
  EXPECT_EQ(chunk_of(2, 8, 7), (std::pair<int64_t, int64_t>{2, 0}));
  EXPECT_EQ(chunk_of(0, 3, 1), (std::pair<int64_t, int64_t>{0, 0}));
  // Two mesh dims on one tensor dim, either order: 10 rows over (2, 3).
  const std::vector<int64_t> mesh = {2, 3};
  EXPECT_EQ(chain_region(10, {0, 1}, mesh, {1, 2}), (std::pair<int64_t, int64_t>{9, 1}));
  EXPECT_EQ(chain_region(10, {0, 1}, mesh, {1, 0}), (std::pair<int64_t, int64_t>{5, 2}));
  EXPECT_EQ(chain_region(10, {1, 0}, mesh, {1, 0}), (std::pair<int64_t, int64_t>{2, 2}));
  EXPECT_EQ(chain_region(10, {1, 0}, mesh, {0, 2}), (std::pair<int64_t, int64_t>{8, 1}));
}

TEST(RedistributePlanTest, SingleDimensionTransitionsUseOneCollective) {
  EXPECT_EQ(plan_text({Shard{0}}, {Replicate{}}, 2),
            (std::vector<std::string>{"all_gather(mesh dim 0, tensor dim 0)"}));
  EXPECT_EQ(plan_text({Partial{}}, {Shard{1}}, 2),
            (std::vector<std::string>{"reduce_scatter(mesh dim 0, tensor dim 1, sum)"}));
  EXPECT_EQ(plan_text({Shard{0}}, {Shard{1}}, 2),
            (std::vector<std::string>{"all_to_all(mesh dim 0, tensor dim 0 -> 1)"}));
  EXPECT_EQ(plan_text({Replicate{}}, {Shard{1}}, 2),
            (std::vector<std::string>{"slice(mesh dim 0, tensor dim 1)"}));
  EXPECT_EQ(plan_text({Partial{ReduceOp::kMax}}, {Replicate{}}, 2),
            (std::vector<std::string>{"all_reduce(mesh dim 0, max)"}));
  EXPECT_EQ(plan_text({Shard{1}}, {Partial{}}, 2),
            (std::vector<std::string>{"zero_pad(mesh dim 0, tensor dim 1, sum)"}));
  EXPECT_TRUE(plan_text({Shard{0}, Replicate{}}, {Shard{0}, Replicate{}}, 2).empty());
}

TEST(RedistributePlanTest, ShrinkingStepsRunBeforeGrowingOnes) {
  // Slicing tp's columns first makes dp's all_gather move half the bytes.
  EXPECT_EQ(plan_text({Shard{0}, Replicate{}}, {Replicate{}, Shard{1}}, 2),
            (std::vector<std::string>{"slice(mesh dim 1, tensor dim 1)",
                                      "all_gather(mesh dim 0, tensor dim 0)"}));
  // A partial sum is reduced after the slice that shrinks it.
  EXPECT_EQ(
      plan_text({Partial{}, Replicate{}}, {Replicate{}, Shard{0}}, 2),
      (std::vector<std::string>{"slice(mesh dim 1, tensor dim 0)", "all_reduce(mesh dim 0, sum)"}));
}

TEST(RedistributePlanTest, NestedSplitsAreUndoneInnermostFirst) {
  // (S0, S0) in mesh order -> (R, S0): dp's split is outside tp's, so tp's goes first.
  EXPECT_EQ(plan_text({Shard{0}, Shard{0}}, {Replicate{}, Shard{0}}, 1),
            (std::vector<std::string>{"all_gather(mesh dim 1, tensor dim 0)",
                                      "all_gather(mesh dim 0, tensor dim 0)",
                                      "slice(mesh dim 1, tensor dim 0)"}));
  // The same placements in the other order (tp outside dp): only dp's split goes.
  EXPECT_EQ(plan_text({Shard{0}, Shard{0}}, {Replicate{}, Shard{0}}, 1, {1, 0}, {1, 0}),
            (std::vector<std::string>{"all_gather(mesh dim 0, tensor dim 0)"}));
}

TEST(DTensorSpecTest, RegionsAreExactForUnevenAndEmptyShards) {
  threads::run_ranks(8, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 4}, {"dp", "tp"});
    // 5 rows over dp then tp (the mesh order): dp gives 3 / 2, tp splits each.
    const DTensorSpec spec(mesh, {Shard{0}, Shard{0}}, {5, 3}, DType::kF32);
    const auto [offset, size] = spec.region(mesh.coordinate());
    const int64_t dp = mesh.local_rank("dp"), tp = mesh.local_rank("tp");
    const auto [o1, n1] = chunk_of(5, 2, dp);
    const auto [o2, n2] = chunk_of(n1, 4, tp);
    EXPECT_EQ(offset, (Shape{o1 + o2, 0}));
    EXPECT_EQ(size, (Shape{n2, 3}));
  });
}

TEST(DTensorSweepTest, RandomRedistributionsMatchTheSingleProcessModel) {
  for (int world : {1, 2, 3, 4, 6, 8}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    threads::run_ranks(world, [world](ProcessGroup& pg) {
      testing::check_random_redistributions(pg.shared_from_this(), 1000 + world, 60);
    });
  }
}

TEST(DTensorTest, PrintsGlobalMeshPlacementsAndLocalBox) {
  threads::run_ranks(8, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 4}, {"dp", "tp"});
    const DTensor w = distribute_tensor(zeros({1024, 768}), mesh, {Shard{0}, Replicate{}});
    if (pg.rank() == 5) {
      EXPECT_EQ(w.str(),
                "DTensor(global f32[1024, 768], mesh (dp=2, tp=4), placements (Shard(0), "
                "Replicate()), local f32[512, 768] at offset [512, 0])");
    }
  });
}

// The gradient of f(global) = sum(global * weights) reaches the source of every entry point
// as the single-process gradient (weights), laid out by the dual placements.
TEST(DTensorGradTest, EveryEntryPointMatchesTheSingleProcessGradient) {
  threads::run_ranks(4, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
    const Shape shape = {5, 6};
    Generator gen(11);
    const Tensor global = randn(shape, gen);   // the same on every rank
    const Tensor weights = randn(shape, gen);  // d f / d global
    const DTensorSpec sharded(mesh, {Shard{0}, Shard{1}}, shape, DType::kF32);
    auto my_box = [&](const Tensor& t) {
      return contiguous(narrow(narrow(t, 0, sharded.local_offset()[0], sharded.local_shape()[0]), 1,
                               sharded.local_offset()[1], sharded.local_shape()[1]));
    };
    const Tensor my_weights = my_box(weights);

    // redistribute (Shard, Shard) -> (Replicate, Replicate), a replicated loss: with
    // grad_placements = Replicate the source's gradient is exactly its box of `weights`.
    {
      const Tensor local = my_box(global).set_requires_grad(true);
      const DTensor x = DTensor::from_local(local, mesh, {Shard{0}, Shard{1}});
      const Tensor all = x.full_tensor({Replicate{}, Replicate{}});
      backward(sum(mul(all, weights)));
      EXPECT_EQ(to_vector<float>(local.grad()), to_vector<float>(my_weights));
    }
    // The same with the default (dual) placements: every rank's replicated loss counts, so the
    // gradient is the world size (4) times the single-process one.
    {
      const Tensor local = my_box(global).set_requires_grad(true);
      const DTensor x = DTensor::from_local(local, mesh, {Shard{0}, Shard{1}});
      backward(sum(mul(x.full_tensor(), weights)));
      EXPECT_EQ(to_vector<float>(local.grad()), to_vector<float>(mul(my_weights, 4.0)));
    }
    // distribute_tensor from a full tensor, then to_local: the sum over ranks of the partial
    // gradients is the single-process gradient.
    {
      const Tensor full = clone(global).set_requires_grad(true);
      const DTensor x = distribute_tensor(full, mesh, {Shard{0}, Shard{1}});
      backward(sum(mul(x.to_local(), my_weights)));
      Tensor total = clone(full.grad());
      pg.all_reduce(total);
      EXPECT_EQ(to_vector<float>(total), to_vector<float>(weights));
    }
    // A Partial(sum) input redistributed to (Shard(0), Replicate) (a reduce_scatter and an
    // all_reduce): its gradient is the whole gradient on every rank, gathered from the shards.
    // Both tp ranks compute the same loss from their replicated piece: grad_placements says so.
    {
      const Tensor part = mul(global, 0.25).set_requires_grad(true);  // 4 parts sum to global
      const DTensor x = DTensor::from_local(part, mesh, {Partial{}, Partial{}});
      const DTensor y = x.redistribute({Shard{0}, Replicate{}});
      const DTensorSpec& s = y.spec();
      const Tensor w = contiguous(narrow(weights, 0, s.local_offset()[0], s.local_shape()[0]));
      backward(sum(mul(y.to_local({Shard{0}, Replicate{}}), w)));
      EXPECT_EQ(to_vector<float>(part.grad()), to_vector<float>(weights));
    }
    // from_local with grad_placements: every rank holds the full tensor; each uses its own
    // shard (the dual of Replicate is Partial, zero-padded), and from_local hands the gradient
    // on as Replicate: an all_reduce, so every rank's full gradient is `weights`.
    {
      const Tensor full = clone(global).set_requires_grad(true);
      const DTensor x = DTensor::from_local(full, mesh, {Replicate{}, Replicate{}},
                                            {.grad_placements = {Replicate{}, Replicate{}}});
      const DTensor y = x.redistribute({Shard{0}, Shard{1}});
      backward(sum(mul(y.to_local(), my_weights)));
      EXPECT_EQ(to_vector<float>(full.grad()), to_vector<float>(weights));
    }
  });
}

// Partial(avg): the global value is the mean of the ranks' values, so each rank's gradient is
// 1/k of the global gradient.
TEST(DTensorGradTest, PartialAverageDividesTheGradient) {
  threads::run_ranks(4, [](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {4}, {"dp"});
    const Tensor mine = full({3}, static_cast<double>(pg.rank())).set_requires_grad(true);
    const DTensor x = DTensor::from_local(mine, mesh, {Partial{ReduceOp::kAvg}});
    const Tensor global = x.full_tensor({Replicate{}});
    EXPECT_EQ(to_vector<float>(global), (std::vector<float>{1.5f, 1.5f, 1.5f}));
    backward(sum(mul(global, from_vector<float>({4, 8, 12}))));
    EXPECT_EQ(to_vector<float>(mine.grad()), (std::vector<float>{1, 2, 3}));
    // No gradient is defined through Partial(max).
    const Tensor other = full({3}, 1.0).set_requires_grad(true);
    const DTensor m = DTensor::from_local(other, mesh, {Partial{ReduceOp::kMax}});
    EXPECT_THROW(backward(sum(m.full_tensor())), NotImplemented);
  });
}

// Runs fn on every rank and checks each throws InvalidArgument with the same message containing
// `part`.
void expect_same_error_everywhere(int world, const std::function<void(ProcessGroup&)>& fn,
                                  const std::string& part) {
  std::vector<std::string> messages(static_cast<size_t>(world));
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    try {
      fn(pg);
      messages[pg.rank()] = "no error";
    } catch (const InvalidArgument& e) {
      messages[pg.rank()] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_EQ(m, messages[0]);
    EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

TEST(DTensorErrorTest, BadPlacementsFailOnEveryRankWithOneMessage) {
  auto mesh_of = [](ProcessGroup& pg) {
    return init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
  };
  expect_same_error_everywhere(
      4,
      [&](ProcessGroup& pg) {
        distribute_tensor(zeros({4, 4}), mesh_of(pg), {Shard{0}});
      },
      "give 1 placement for mesh (dp=2, tp=2) of 2 dimensions");
  expect_same_error_everywhere(
      4,
      [&](ProcessGroup& pg) {
        distribute_tensor(zeros({4, 4}), mesh_of(pg), {Shard{2}, Replicate{}});
      },
      "Shard(2) is beyond a tensor of 2 dimensions");
  expect_same_error_everywhere(
      4,
      [&](ProcessGroup& pg) {
        DTensor::from_local(zeros({2}), mesh_of(pg), {Partial{ReduceOp::kMax}, Partial{}});
      },
      "mix Partial(max) with Partial(sum)");
  expect_same_error_everywhere(
      4,
      [&](ProcessGroup& pg) {
        DTensor::from_local(zeros({2, 2}), mesh_of(pg), {Shard{0}, Replicate{}},
                            {.shard_order = {0, 0}});
      },
      "not a permutation");
}

TEST(DTensorErrorTest, FromLocalNamesTheFirstRankThatDisagrees) {
  expect_same_error_everywhere(
      4,
      [](ProcessGroup& pg) {
        DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {4}, {"dp"});
        // 10 rows over 4 ranks are 3, 3, 3, 1; rank 2 claims 2.
        const int64_t rows[] = {3, 3, 2, 1};
        DTensor::from_local(zeros({rows[pg.rank()], 4}), mesh, {Shard{0}},
                            {.global_shape = Shape{10, 4}});
      },
      "rank 2 (mesh coordinate (2,)) holds a local tensor of shape (2, 4) but global "
      "f32[10, 4], mesh (dp=4), placements (Shard(0)) gives it (3, 4)");
  // Without a global shape it is inferred (10 rows) and rank 2's 2 rows still disagree.
  expect_same_error_everywhere(
      4,
      [](ProcessGroup& pg) {
        DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {4}, {"dp"});
        const int64_t rows[] = {3, 3, 2, 1};
        DTensor::from_local(zeros({rows[pg.rank()], 4}), mesh, {Shard{0}});
      },
      "rank 2");
  expect_same_error_everywhere(
      2,
      [](ProcessGroup& pg) {
        DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
        DTensor::from_local(zeros({2}, pg.rank() == 1 ? DType::kBF16 : DType::kF32), mesh,
                            {Replicate{}});
      },
      "rank 1 (mesh coordinate (1,)) holds a 1-dimensional bf16 tensor");
}

TEST(DTensorErrorTest, DTensorsOfDifferentMeshesAreRefused) {
  threads::run_ranks(4, [](ProcessGroup& pg) {
    DeviceMesh a = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
    DeviceMesh b = init_device_mesh(pg.shared_from_this(), {4}, {"dp"});
    const DTensor x = distribute_tensor(zeros({4}), a, {Shard{0}, Replicate{}});
    const DTensor y = distribute_tensor(zeros({4}), b, {Shard{0}});
    EXPECT_NO_THROW(check_same_mesh("add", x, x));
    try {
      check_same_mesh("add", x, y);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("different meshes"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace tessel
