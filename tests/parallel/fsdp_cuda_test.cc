// fully_shard on CUDA tensors (label gpu; every test skips, printing why, without a CUDA
// device): the FSDP parity tests of fsdp_test on cuda:0 with ranks as threads sharing the GPU
// (threads backend), against single-process training on the GPU and on the CPU; one step's
// worth of training over NCCL at world size 1; and an FSDP step over NCCL exported as a trace
// in which all_gathers overlap device-timed compute spans.
//
// Tolerances, per step's loss over 20 AdamW steps (relative):
// - one rank against one CUDA process: 1e-6 (the same kernels on the same values; the CPU test
//   asserts equality, but cuBLAS may pick another algorithm for another buffer);
// - 2-4 ranks, HSDP, ZeRO-2, 2-way reshard, accumulation against one CUDA process: 1e-5 (the
//   averages reorder float sums, as on the CPU);
// - CUDA ranks against one CPU process: 1e-3 (different GEMM libraries and summation orders;
//   cuda_gpt_test bounds one step at 2e-5, and AdamW steps compound it);
// - bf16 parameters against f32 training: 3e-2 (bf16's precision, as on the CPU).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tessel/collectives/nccl/nccl_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/store/memory_store.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/collectives/device_test_util.h"
#include "tests/gpu/require_cuda.h"
#include "tests/parallel/fsdp_checks.h"
#include "tests/parallel/fsdp_trace_checks.h"

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
  mp.mp_policy = {
      .param_dtype = DType::kBF16, .reduce_dtype = DType::kF32, .output_dtype = DType::kF32};
  expect_close(train_fsdp(on_gpu({{2}, {"dp"}, mp})), single_gpu(), 3e-2);
  FsdpSetup autocast = on_gpu({{2}, {"dp"}, {}});
  autocast.autocast = true;
  expect_close(train_fsdp(autocast), single_gpu(), 3e-2);
}

// NCCL at world size 1 (NCCL refuses two ranks on one GPU): the collectives run on the group's
// communication stream, ordered by events, and FSDP relies on Work::wait() alone.
TEST(FsdpCudaParityTest, NcclWorldOfOneMatchesOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  if (!nccl::is_available()) GTEST_SKIP() << "this build has no NCCL backend";
  auto world =
      nccl::create_process_group(std::make_shared<MemoryStore>(), 0, 1, NcclOptions{.device = 0});
  ASSERT_EQ(world->default_device(), kGpu);
  expect_close(testing::train_fsdp_rank(world, on_gpu({{1}, {"dp"}, {}})), single_gpu(), 1e-6);
}

// A CUDA FSDP step's trace shows communication overlapping compute, timed on the device: over
// NCCL at world size 1 the all_gathers run on the group's communication stream, timed by their
// events, and each group's forward and backward are compute spans timed by events on the compute
// stream (both completed by the watchdog when it sees their end events). A prefetched all_gather
// runs while the previous block computes; host-timed spans (the time to enqueue the kernels)
// would end long before it. The watchdog's 2 ms poll shifts each slice by up to that much, so the
// model is made of several blocks and two steps are looked at.
TEST(FsdpCudaTraceTest, NcclStepTraceShowsAllGathersOverlappingDeviceTimedCompute) {
  TESSEL_REQUIRE_CUDA();
  if (!nccl::is_available()) GTEST_SKIP() << "this build has no NCCL backend";
  auto world =
      nccl::create_process_group(std::make_shared<MemoryStore>(), 0, 1, NcclOptions{.device = 0});
  const DeviceMesh mesh = init_device_mesh(world, {1}, {"dp"});
  const nn::GptConfig config{
      .vocab_size = 256, .block_size = 256, .n_layer = 6, .n_head = 8, .n_embd = 512, .seed = 1};
  const std::unique_ptr<nn::GPT> gpt = testing::sharded_gpt(config, mesh, kGpu);
  const Tensor x = zeros({16, config.block_size}, DType::kI64, kGpu);
  auto step = [&] { backward(nn::GPT::loss((*gpt)(x), x)); };
  step();  // records the forward order: prefetching starts with the next step
  synchronize(kGpu);
  fr::FlightRecorder& recorder = fr::FlightRecorder::global();
  const uint64_t since = recorder.recorded();
  step();
  step();
  synchronize(kGpu);
  // The watchdog completes device-timed entries when it next polls their end events.
  const bool settled = testing::eventually([&] {
    for (const fr::Entry& e : recorder.snapshot()) {
      if (e.record_id > since && e.state != fr::EntryState::kCompleted) return false;
    }
    return true;
  });
  ASSERT_TRUE(settled) << "entries of the step still unfinished 5 s after the device finished";

  const std::vector<testing::TraceSlice> slices = testing::exported_slices(since, 0, 1);
  int spans = 0, gathers = 0;
  for (const auto& s : slices) {
    spans += s.category == "user_span";
    gathers += s.category == "all_gather";
  }
  EXPECT_EQ(spans, 2 * 2 * (config.n_layer + 1));  // two steps, forward and backward, each group
  EXPECT_GT(gathers, 0);
  const std::vector<std::string> overlaps = testing::gathers_during_block_compute(slices);
  std::string listed;
  for (const std::string& o : overlaps) listed += "\n  " + o;
  std::printf("all_gathers during block compute (device-timed):%s\n", listed.c_str());
  EXPECT_FALSE(overlaps.empty()) << "no all_gather of " << gathers
                                 << " overlapped a block's compute span";
}

}  // namespace
}  // namespace tessel
