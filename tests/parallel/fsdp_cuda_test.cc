// fully_shard on CUDA tensors (label gpu; every test skips, printing why, without a CUDA
// device): the FSDP parity tests of fsdp_test on cuda:0 with ranks as threads sharing the GPU
// (threads backend), against single-process training on the GPU and on the CPU; one step's
// worth of training over NCCL at world size 1.
//
// Tolerances, per step's loss over 20 AdamW steps (relative):
// - one rank against one CUDA process: 1e-6 (the same kernels on the same values; the CPU test
//   asserts equality, but cuBLAS may pick another algorithm for another buffer);
// - 2-4 ranks, HSDP, ZeRO-2, 2-way reshard, accumulation against one CUDA process: 1e-5 (the
//   averages reorder float sums, as on the CPU);
// - CUDA ranks against one CPU process: 1e-3 (different GEMM libraries and summation orders;
//   cuda_gpt_test bounds one step at 2e-5, and AdamW steps compound it);
// - bf16 parameters against f32 training: 3e-2 (bf16's precision, as on the CPU).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessel/collectives/memory_store.h"
#include "tessel/collectives/nccl/nccl_backend.h"
#include "tessel/parallel/fsdp.h"
#include "tests/gpu/require_cuda.h"
#include "tests/parallel/fsdp_checks.h"

namespace tessel {
namespace {

using testing::expect_close;
using testing::FsdpSetup;
using testing::train_fsdp;
using testing::train_single;

const Device kGpu = Device::cuda(0);

FsdpSetup on_gpu(FsdpSetup setup) {
  setup.device = kGpu;
  return setup;
}

const std::vector<float>& single_gpu() {
  static const std::vector<float> losses = train_single(1, kGpu);
  return losses;
}

TEST(FsdpCudaParityTest, OneRankMatchesOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  expect_close(train_fsdp(on_gpu({{1}, {"dp"}, {}})), single_gpu(), 1e-6);
}

TEST(FsdpCudaParityTest, RankThreadsTwoThreeAndFourMatchOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    expect_close(train_fsdp(on_gpu({{world}, {"dp"}, {}})), single_gpu(), 1e-5);
  }
}

TEST(FsdpCudaParityTest, HsdpZeroTwoAndTwoWayReshardMatchOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  expect_close(train_fsdp(on_gpu({{2, 2}, {"replicate", "shard"}, {}})), single_gpu(), 1e-5);
  FullyShardOptions zero2;
  zero2.reshard_after_forward = false;
  expect_close(train_fsdp(on_gpu({{4}, {"dp"}, zero2})), single_gpu(), 1e-5);
  FullyShardOptions two_way;
  two_way.reshard_after_forward = int64_t{2};
  expect_close(train_fsdp(on_gpu({{4}, {"dp"}, two_way})), single_gpu(), 1e-5);
}

TEST(FsdpCudaParityTest, GradientAccumulationMatchesOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  expect_close(train_fsdp(on_gpu({{2}, {"dp"}, {}, /*micro=*/2})), train_single(2, kGpu), 1e-5);
}

TEST(FsdpCudaParityTest, CudaRanksMatchOneCpuProcess) {
  TESSEL_REQUIRE_CUDA();
  expect_close(train_fsdp(on_gpu({{2}, {"dp"}, {}})), train_single(1, Device::cpu()), 1e-3);
}

TEST(FsdpCudaParityTest, MixedPrecisionStaysCloseToF32) {
  TESSEL_REQUIRE_CUDA();
  FullyShardOptions mp;
  mp.mp_policy = {.param_dtype = DType::kBF16, .reduce_dtype = DType::kF32,
                  .output_dtype = DType::kF32};
  expect_close(train_fsdp(on_gpu({{2}, {"dp"}, mp})), single_gpu(), 3e-2);
  FsdpSetup autocast = on_gpu({{2}, {"dp"}, {}});
  autocast.autocast = true;
  expect_close(train_fsdp(autocast), single_gpu(), 3e-2);
}

// NCCL at world size 1 (NCCL refuses two ranks on one GPU): the collectives run on the group's
// communication stream, ordered by events, and FSDP relies on Work::wait() alone.
TEST(FsdpCudaParityTest, NcclWorldOfOneMatchesOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  if (!nccl_is_available()) GTEST_SKIP() << "this build has no NCCL backend";
  auto world = nccl_create_process_group(std::make_shared<MemoryStore>(), 0, 1,
                                         NcclOptions{.device = 0});
  ASSERT_EQ(world->default_device(), kGpu);
  expect_close(testing::train_fsdp_rank(world, on_gpu({{1}, {"dp"}, {}})), single_gpu(), 1e-6);
}

}  // namespace
}  // namespace tessel
