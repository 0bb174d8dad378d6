#include "tessel/tensor/cuda/cuda_reduce_plan.h"

namespace tessel::cuda {

ChunkCombine plan_chunk_combine(int64_t outputs, int64_t chunks) {
  ChunkCombine c;
  if (outputs <= 0 || chunks <= 1) return c;
  if (chunks >= kBlockCombineMinChunks && outputs <= kBlockCombineMaxOutputs) {
    // About four chunks per thread, a whole number of warps, at most 256 threads.
    int t = 32;
    while (t < 256 && int64_t{t} * 4 < chunks) t *= 2;
    c.per_block = true;
    c.threads = t;
    c.blocks = outputs;
    return c;
  }
  c.threads = 256;
  c.blocks = (outputs + 255) / 256;
  return c;
}

}  // namespace tessel::cuda
