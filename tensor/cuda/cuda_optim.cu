// The fused multi-tensor AdamW step on CUDA: one launch updates up to kAdamWSlicesPerLaunch
// tensors, each block a fixed chunk of one tensor, reading every element's parameter, gradient
// and moments once. The arithmetic is cpu_optim.cc's, operation for operation (explicitly
// rounded; the CPU's loop is baseline code without fused multiply-adds), so a step gives the
// CPU's values bit for bit.
#include <algorithm>

#include "tessel/tensor/cuda/cuda_device.cuh"

namespace tessel::cuda {
namespace {

constexpr int64_t kChunk = 4096;  // elements per block

struct AdamWBatch {
  AdamWSlice slices[kAdamWSlicesPerLaunch];
  int64_t first_block[kAdamWSlicesPerLaunch + 1];  // prefix sums of the slices' block counts
  int count;
};

__global__ void adamw_kernel(AdamWBatch batch, AdamWScalars s) {
  const int64_t block = blockIdx.x;
  int i = 0;
  while (i + 1 < batch.count && batch.first_block[i + 1] <= block) ++i;
  const AdamWSlice& t = batch.slices[i];
  const int64_t begin = (block - batch.first_block[i]) * kChunk;
  const int64_t end = begin + kChunk < t.numel ? begin + kChunk : t.numel;
  const float one_minus_beta1 = sub(1.0f, s.beta1), one_minus_beta2 = sub(1.0f, s.beta2);
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    const float g = t.grad[k];
    const float m = add(mul(s.beta1, t.exp_avg[k]), mul(one_minus_beta1, g));
    const float v = add(mul(s.beta2, t.exp_avg_sq[k]), mul(mul(one_minus_beta2, g), g));
    t.exp_avg[k] = m;
    t.exp_avg_sq[k] = v;
    t.param[k] = sub(mul(t.param[k], s.lr_decay),
                     div(mul(s.step_size, m), add(mul(__fsqrt_rn(v), s.inv_sqrt_bc2), s.eps)));
  }
}

}  // namespace

void launch_adamw(const Launch& l, const AdamWSlice* slices, int count, const AdamWScalars& s) {
  for (int start = 0; start < count; start += kAdamWSlicesPerLaunch) {
    AdamWBatch batch{};
    batch.count = std::min(kAdamWSlicesPerLaunch, count - start);
    int64_t blocks = 0;
    for (int i = 0; i < batch.count; ++i) {
      batch.slices[i] = slices[start + i];
      batch.first_block[i] = blocks;
      blocks += (batch.slices[i].numel + kChunk - 1) / kChunk;
    }
    batch.first_block[batch.count] = blocks;
    if (blocks == 0) continue;
    if (blocks >= (int64_t{1} << 31)) {
      throw_invalid_argument("adamw: " + std::to_string(blocks) +
                             " blocks are more than CUDA launches (at most 2^31 - 1)");
    }
    adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, l.stream>>>(batch, s);
    check_launch("adamw", l.device);
  }
}

}  // namespace tessel::cuda
