// The DTensor property sweep (smaller) over Gloo with real processes (forked, FileStore
// rendezvous), world sizes 3 and 4; and Shard->Shard of large uneven tensors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/ops.h"
#include "tests/collectives/collective_checks.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parallel/dtensor_checks.h"

namespace tessel {
namespace {

void sweep_over_gloo(int world, int cases) {
  const auto outcomes = testing::run_processes(
      world,
      [world, cases](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        testing::check_random_redistributions(
            gloo::create_process_group(store, rank, world, options), 7000 + world, cases);
      },
      std::chrono::seconds(150));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

TEST(DTensorGlooTest, RandomRedistributionsOverThreeProcesses) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  sweep_over_gloo(3, 25);
}

TEST(DTensorGlooTest, RandomRedistributionsOverFourProcesses) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  sweep_over_gloo(4, 25);
}

// Shard->Shard of tensors large enough for several pieces per pair, unevenly split, in 2-D
// (strided sends or strided receives) and 3-D (both strided), blocking and async: the result
// equals the target's slice of the global tensor bit for bit.
TEST(DTensorGlooTest, LargeUnevenShardToShardIsExact) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const auto outcomes = testing::run_processes(
      3,
      [](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        const DeviceMesh mesh =
            init_device_mesh(gloo::create_process_group(store, rank, 3, options), {3}, {"tp"});
        struct Case {
          Shape shape;
          int64_t from, to;
        };
        const Case cases[] = {
            {{3001, 514}, 0, 1}, {{3001, 514}, 1, 0}, {{61, 301, 97}, 1, 2}, {{61, 301, 97}, 2, 0}};
        for (DType dtype : {DType::kF32, DType::kBF16}) {
          for (const Case& c : cases) {
            Generator gen(c.shape[0] * 7 + c.from);
            const Tensor full = randn(c.shape, gen, dtype);
            const DTensor x = distribute_tensor(full, mesh, {Shard{c.from}});
            const Tensor want = distribute_tensor(full, mesh, {Shard{c.to}}).to_local();
            AsyncDTensor pending = x.redistribute_async({Shard{c.to}});
            pending.work.wait();
            for (const Tensor& got : {x.redistribute({Shard{c.to}}).to_local(),
                                      contiguous(pending.result.to_local())}) {
              if (got.shape() != want.shape() ||
                  std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()) != 0) {
                throw testing::CheckFailure(
                    fmt::format("rank {}: S{}->S{} of {} {} differs from the slice", rank, c.from,
                                c.to, shape_str(c.shape), dtype_name(dtype)));
              }
            }
          }
        }
      },
      std::chrono::seconds(150));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

}  // namespace
}  // namespace tessel
