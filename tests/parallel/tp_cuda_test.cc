// Tensor parallelism of the GPT on CUDA tensors, ranks as threads sharing one GPU (threads
// backend; label gpu, every test skips, printing why, without a CUDA device): tp 2 and 4 with
// and without sequence parallelism, and FSDP x TP on (dp_shard, tp), against single-process
// training on the GPU: the loss of every step over 20 AdamW steps and every parameter's
// gradient of the first step. Tolerances: 1e-4 relative for the losses, 1e-4 of each
// gradient's largest entry (the CPU test's 1e-5, widened for cuBLAS choosing different
// algorithms, and split-K reductions, for the split GEMMs' shapes).
#include <gtest/gtest.h>

#include <string>

#include "tests/gpu/require_cuda.h"
#include "tests/parallel/tp_checks.h"

namespace tessel {
namespace {

using testing::TpRun;
using testing::TpSetup;

const Device kGpu = Device::cuda(0);

const TpRun& single_gpu() {
  static const TpRun run = testing::train_single_process(20, kGpu);
  return run;
}

void expect_parity(TpSetup setup) {
  setup.device = kGpu;
  const TpRun got = testing::train_tensor_parallel_threads(setup);
  const std::string error = testing::parity_error(got, single_gpu(), 1e-4, 1e-4);
  EXPECT_TRUE(error.empty()) << error;
}

TEST(TpCudaParityTest, TensorParallelTwoAndFourMatchOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    expect_parity({{tp}, {"tp"}});
  }
}

TEST(TpCudaParityTest, SequenceParallelMatchesOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  expect_parity({{2}, {"tp"}, /*sequence_parallel=*/true});
  SCOPED_TRACE("overlapped all_gathers");
  expect_parity({{2}, {"tp"}, true, /*overlap_chunks=*/2});
}

TEST(TpCudaParityTest, FsdpTimesTensorParallelMatchesOneCudaProcess) {
  TESSEL_REQUIRE_CUDA();
  expect_parity({{2, 2}, {"dp_shard", "tp"}});
}

}  // namespace
}  // namespace tessel
