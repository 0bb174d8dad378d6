// The threads backend on CUDA tensors: ranks as threads sharing one GPU (label gpu; every test
// skips, printing why, without a CUDA device). Every collective x world sizes 1-4 x dtypes
// {f32, bf16, i64} x counts {0, 1, 37, 1M} on cuda:0, checked against the same expectations
// as the CPU runs (so against the CPU's results: sums of small integers are exact, averages
// divide as the CPU does); splits; a caller's stream other than the default one; ranks that
// disagree on the device type.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collective_checks.h"
#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"
#include "tests/gpu/require_cuda.h"

namespace tessel {
namespace {

const Device kGpu = Device::cuda(0);

class ThreadsCudaSweepTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadsCudaSweepTest, EveryCollectiveMatchesTheCpuExpectation) {
  TESSEL_REQUIRE_CUDA();
  threads::run_ranks(GetParam(), [](ProcessGroup& pg) {
    testing::check_everything(pg, testing::acceptance_counts(/*large=*/false), kGpu);
  });
}

TEST_P(ThreadsCudaSweepTest, OneMillionElements) {
  TESSEL_REQUIRE_CUDA();
  threads::run_ranks(GetParam(), [](ProcessGroup& pg) { testing::check_one_million(pg, kGpu); });
}

TEST_P(ThreadsCudaSweepTest, SplitsIntoOddColours) {
  TESSEL_REQUIRE_CUDA();
  const int size = GetParam();
  threads::run_ranks(size, [&](ProcessGroup& pg) {
    testing::check_split(pg, 3, /*with_no_color=*/false, kGpu);
    testing::check_split(pg, 1, /*with_no_color=*/size > 1, kGpu);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadsCudaSweepTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

// Each rank writes its tensor on a stream of its own and calls the collective with that stream
// current: the collective must order after the write (an event), not after the default stream.
TEST(ThreadsCudaTest, OrdersAfterTheCallersCurrentStream) {
  TESSEL_REQUIRE_CUDA();
  threads::run_ranks(3, [](ProcessGroup& pg) {
    const Stream mine = create_stream(kGpu);
    StreamGuard on_mine(mine);
    for (int round = 0; round < 20; ++round) {
      Tensor t = empty({1 << 20}, DType::kF32, kGpu);
      fill_(t, static_cast<double>(pg.rank() + round));
      pg.all_reduce(t);
      const double want = 3.0 * round + 3.0;  // (0 + 1 + 2) + 3 * round
      const std::vector<float> got = to_vector<float>(narrow(t, 0, (1 << 20) - 1, 1));
      if (got[0] != want) {
        throw testing::CheckFailure(
            fmt::format("round {}: the last element is {}, expected {}", round, got[0], want));
      }
    }
  });
}

// Each rank sees every rank's post, so both fail with the same reason and neither reads memory
// it cannot.
TEST(ThreadsCudaTest, RanksThatMixCpuAndCudaTensorsFailAlike) {
  TESSEL_REQUIRE_CUDA();
  std::vector<std::string> errors(2);
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    Tensor t = zeros({4}, DType::kF32, pg.rank() == 0 ? Device::cpu() : kGpu);
    try {
      pg.all_reduce(t);
    } catch (const InvalidArgument& e) {
      errors[pg.rank()] = e.what();
    }
    pg.barrier();  // the group is still usable
  });
  for (const std::string& error : errors) {
    EXPECT_NE(error.find("rank 0 passed cpu tensors but rank 1 passed cuda tensors"),
              std::string::npos)
        << error;
  }
}

}  // namespace
}  // namespace tessel
