// RoPE on CUDA: one thread per rotated pair (x[i], x[i + D/2]) of a head, f32 in registers, the
// rotation in the order of the CPU kernel (kernels/llama/rope.cc). The per-pair body comes first
// (host-and-device, so tests run it on the CPU), then the kernel and its launcher.

#include <cstdint>

#include "tessel/kernels/llama/cuda/internal/llama_cuda_params.h"

namespace tessel::kernels::cuda {

// Rotates pair `item` (row, head, i; i fastest) of p.x into p.out:
//   out[i] = x[i] c - x[i + D/2] s,  out[i + D/2] = x[i + D/2] c + x[i] s,  s = sign * sin.
template <LlamaElem E>
TESSEL_LLAMA_HD void rope_pair(const RopeParams& p, int64_t item) {
  const int64_t i = item % p.half;
  const int64_t row_head = item / p.half;  // row * H + h
  const int64_t row = row_head / p.heads;
  const int64_t table = (p.batched_tables ? row : row % p.seq) * p.half + i;
  const int64_t at = row_head * 2 * p.half + i;
  const float x1 = load_elem<E>(p.x, at);
  const float x2 = load_elem<E>(p.x, at + p.half);
  const float c = p.cos[table];
  const float s = p.sign * p.sin[table];
  store_elem<E>(p.out, at, x1 * c - x2 * s);
  store_elem<E>(p.out, at + p.half, x2 * c + x1 * s);
}

}  // namespace tessel::kernels::cuda

#if defined(__CUDACC__)

#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel::kernels::cuda {
namespace {

template <LlamaElem E>
__global__ void __launch_bounds__(kLlamaThreads) rope_kernel(const RopeParams p) {
  llama_grid_stride(p.pairs(), blockIdx.x, gridDim.x, threadIdx.x,
                    [&](int64_t item) { rope_pair<E>(p, item); });
}

}  // namespace

void launch_rope(const RopeParams& p, LlamaElem elem, cudaStream_t stream) {
  const int64_t blocks = llama_blocks(p.pairs());
  if (blocks == 0) return;
  const auto grid = static_cast<unsigned>(blocks);
  switch (elem) {
    case LlamaElem::kF32:
      rope_kernel<LlamaElem::kF32><<<grid, kLlamaThreads, 0, stream>>>(p);
      break;
    case LlamaElem::kBf16:
      rope_kernel<LlamaElem::kBf16><<<grid, kLlamaThreads, 0, stream>>>(p);
      break;
    case LlamaElem::kF16:
      rope_kernel<LlamaElem::kF16><<<grid, kLlamaThreads, 0, stream>>>(p);
      break;
  }
  ::tessel::cuda::check_launch("rope_kernel", ::tessel::cuda::current_device());
}

}  // namespace tessel::kernels::cuda

#endif  // __CUDACC__
