// DTensor on CUDA tensors, ranks as threads sharing one GPU (threads backend): the property
// sweep of dtensor_test (random meshes, shapes, dtypes, placement pairs, shard orders, async
// redistributions) with every local tensor on cuda:0, checked bit for bit against the
// single-process model on the CPU. Label gpu: skips, printing why, without a CUDA device.
#include <gtest/gtest.h>

#include <string>

#include "tessel/collectives/threads/threads_backend.h"
#include "tests/gpu/require_cuda.h"
#include "tests/parallel/dtensor_checks.h"

namespace tessel {
namespace {

class DTensorCudaSweepTest : public ::testing::TestWithParam<int> {};

TEST_P(DTensorCudaSweepTest, RedistributionsMatchTheCpuModelBitForBit) {
  TESSEL_REQUIRE_CUDA();
  const int world = GetParam();
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    testing::check_random_redistributions(pg.shared_from_this(), /*seed=*/77 + world,
                                          /*cases=*/60, Device::cuda(0));
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DTensorCudaSweepTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

}  // namespace
}  // namespace tessel
