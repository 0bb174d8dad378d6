// SwiGLU on CUDA: one thread per element (grid-stride), f32 in registers, the formulas of the
// CPU kernel (kernels/llama/swiglu.cc) with an accurate sigmoid. The per-element bodies come first
// (host-and-device, so tests run them on the CPU), then the kernels and their launchers.

#include <cmath>
#include <cstdint>

#include "tessel/kernels/llama/cuda/internal/llama_cuda_params.h"

namespace tessel::kernels::cuda {

TESSEL_LLAMA_HD float llama_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// out = silu(gate) * up at element i.
template <LlamaElem E>
TESSEL_LLAMA_HD void swiglu_forward_at(const SwigluParams& p, int64_t i) {
  const float g = load_elem<E>(p.gate, i);
  const float u = load_elem<E>(p.up, i);
  store_elem<E>(p.out, i, g * llama_sigmoid(g) * u);
}

// d gate = grad * up * s * (1 + gate * (1 - s)), d up = grad * silu(gate), s = sigmoid(gate).
template <LlamaElem E>
TESSEL_LLAMA_HD void swiglu_backward_at(const SwigluParams& p, int64_t i) {
  const float dy = load_elem<E>(p.grad, i);
  const float g = load_elem<E>(p.gate, i);
  const float u = load_elem<E>(p.up, i);
  const float s = llama_sigmoid(g);
  store_elem<E>(p.grad_gate, i, dy * u * s * (1.0f + g * (1.0f - s)));
  store_elem<E>(p.grad_up, i, dy * g * s);
}

}  // namespace tessel::kernels::cuda

#if defined(__CUDACC__)

#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel::kernels::cuda {
namespace {

template <LlamaElem E>
__global__ void __launch_bounds__(kLlamaThreads) swiglu_forward_kernel(const SwigluParams p) {
  llama_grid_stride(p.n, blockIdx.x, gridDim.x, threadIdx.x,
                    [&](int64_t i) { swiglu_forward_at<E>(p, i); });
}

template <LlamaElem E>
__global__ void __launch_bounds__(kLlamaThreads) swiglu_backward_kernel(const SwigluParams p) {
  llama_grid_stride(p.n, blockIdx.x, gridDim.x, threadIdx.x,
                    [&](int64_t i) { swiglu_backward_at<E>(p, i); });
}

// Launches kernel<E> for the runtime `elem` over p.n elements.
template <template <LlamaElem> class Kernel>
void launch(const SwigluParams& p, LlamaElem elem, cudaStream_t stream, const char* name) {
  const int64_t blocks = llama_blocks(p.n);
  if (blocks == 0) return;
  const auto grid = static_cast<unsigned>(blocks);
  switch (elem) {
    case LlamaElem::kF32:
      Kernel<LlamaElem::kF32>::run(grid, stream, p);
      break;
    case LlamaElem::kBf16:
      Kernel<LlamaElem::kBf16>::run(grid, stream, p);
      break;
    case LlamaElem::kF16:
      Kernel<LlamaElem::kF16>::run(grid, stream, p);
      break;
  }
  ::tessel::cuda::check_launch(name, ::tessel::cuda::current_device());
}

template <LlamaElem E>
struct Forward {
  static void run(unsigned grid, cudaStream_t stream, const SwigluParams& p) {
    swiglu_forward_kernel<E><<<grid, kLlamaThreads, 0, stream>>>(p);
  }
};

template <LlamaElem E>
struct Backward {
  static void run(unsigned grid, cudaStream_t stream, const SwigluParams& p) {
    swiglu_backward_kernel<E><<<grid, kLlamaThreads, 0, stream>>>(p);
  }
};

}  // namespace

void launch_swiglu_forward(const SwigluParams& p, LlamaElem elem, cudaStream_t stream) {
  launch<Forward>(p, elem, stream, "swiglu_forward_kernel");
}

void launch_swiglu_backward(const SwigluParams& p, LlamaElem elem, cudaStream_t stream) {
  launch<Backward>(p, elem, stream, "swiglu_backward_kernel");
}

}  // namespace tessel::kernels::cuda

#endif  // __CUDACC__
