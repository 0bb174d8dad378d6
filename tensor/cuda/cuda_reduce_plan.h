#pragma once
// Private: how the CUDA reductions (cuda_reduce.cu) combine the partial results of a long row
// (or a tall column) cut into chunks. Plain C++, tested on the CPU
// (tests/tensor/cuda_reduce_plan_test.cc). A full reduction (sum/mean/max of a whole tensor) is
// one row of numel() elements: its chunks are reduced by as many blocks, and the partials then
// combined by one block whose threads share them (each its strided share in order, then the
// block's tree), instead of one thread walking them all. Many short outputs keep one thread
// each. Every choice depends on the shape alone, so results repeat bit for bit.

#include <cstdint>

namespace tessel::cuda {

struct ChunkCombine {
  // One block per output: thread t combines chunks t, t + threads, ... in order, then the block
  // combines its threads' results (block_reduce). Otherwise one thread per output walks its
  // chunks in order, `threads` outputs per block.
  bool per_block = false;
  int threads = 0;
  int64_t blocks = 0;  // 0: nothing to combine (one chunk per output, finished by the reduce)
};

// From this many chunks per output, and up to kBlockCombineMaxOutputs outputs, a block shares
// each output's combine.
inline constexpr int64_t kBlockCombineMinChunks = 16;
inline constexpr int64_t kBlockCombineMaxOutputs = 65536;

ChunkCombine plan_chunk_combine(int64_t outputs, int64_t chunks);

}  // namespace tessel::cuda
