// How the CUDA reductions combine chunk partials (tensor/cuda/cuda_reduce_plan.h), on the CPU:
// a full reduction's partials are shared by a block's threads (not walked by one thread), many
// short outputs keep one thread each, and the block size is a whole number of warps whose
// strided shares cover every chunk once, chosen by the shape alone.
#include "tessel/tensor/cuda/cuda_reduce_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace tessel::cuda {
namespace {

TEST(CudaReducePlanTest, FullReductionCombinesItsChunksInOneBlockOfManyThreads) {
  // sum() of 2^26 elements: one row cut into 4,096 chunks of 16,384.
  const ChunkCombine c = plan_chunk_combine(/*outputs=*/1, /*chunks=*/4096);
  EXPECT_TRUE(c.per_block);
  EXPECT_EQ(c.blocks, 1);
  EXPECT_EQ(c.threads, 256);
  // A few chunks more than one: still a block, of one warp.
  const ChunkCombine few = plan_chunk_combine(1, kBlockCombineMinChunks);
  EXPECT_TRUE(few.per_block);
  EXPECT_EQ(few.threads, 32);
}

TEST(CudaReducePlanTest, ManyOutputsOrFewChunksKeepOneThreadPerOutput) {
  EXPECT_EQ(plan_chunk_combine(1, 1).blocks, 0) << "one chunk: the reduce finishes the output";
  EXPECT_EQ(plan_chunk_combine(0, 100).blocks, 0);
  const ChunkCombine rows = plan_chunk_combine(100000, 2);
  EXPECT_FALSE(rows.per_block);
  EXPECT_EQ(rows.threads, 256);
  EXPECT_EQ(rows.blocks, (100000 + 255) / 256);
  EXPECT_FALSE(plan_chunk_combine(kBlockCombineMaxOutputs + 1, 64).per_block);
  EXPECT_TRUE(plan_chunk_combine(kBlockCombineMaxOutputs, 64).per_block);
}

// Thread t of the block combine takes chunks t, t + T, ... (combine_chunks_block_kernel).
TEST(CudaReducePlanTest, BlockOfWholeWarpsCoversEveryChunkOnce) {
  for (int64_t chunks : {16, 17, 100, 255, 1024, 4097}) {
    const ChunkCombine c = plan_chunk_combine(3, chunks);
    ASSERT_TRUE(c.per_block) << chunks;
    EXPECT_EQ(c.threads % 32, 0);
    std::vector<int> taken(static_cast<size_t>(chunks), 0);
    for (int t = 0; t < c.threads; ++t) {
      for (int64_t k = t; k < chunks; k += c.threads) ++taken[static_cast<size_t>(k)];
    }
    for (int64_t k = 0; k < chunks; ++k) EXPECT_EQ(taken[static_cast<size_t>(k)], 1) << k;
    EXPECT_EQ(plan_chunk_combine(3, chunks).threads, c.threads) << "a function of the shape";
  }
}

}  // namespace
}  // namespace tessel::cuda
