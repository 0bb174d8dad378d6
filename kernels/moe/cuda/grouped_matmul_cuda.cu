// The grouped matmul on CUDA: one thread per output element (grid-stride), f32 accumulation in
// row order. A plain first version (no tiling, no tensor cores): correct for any group sizes,
// covered by the backend conformance test; the per-element bodies are in
// internal/grouped_matmul_cuda_params.h.

#include "tessel/kernels/moe/cuda/internal/grouped_matmul_cuda_params.h"
#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel::kernels::cuda {
namespace {

template <LlamaElem E>
__global__ void __launch_bounds__(kLlamaThreads)
    grouped_matmul_kernel(const GroupedMatmulParams p) {
  llama_grid_stride(p.rows * p.cols, blockIdx.x, gridDim.x, threadIdx.x,
                    [&](int64_t i) { grouped_matmul_at<E>(p, i); });
}

template <LlamaElem E>
__global__ void __launch_bounds__(kLlamaThreads)
    grouped_weight_grad_kernel(const GroupedWeightGradParams p) {
  llama_grid_stride(p.groups * p.inner * p.cols, blockIdx.x, gridDim.x, threadIdx.x,
                    [&](int64_t i) { grouped_weight_grad_at<E>(p, i); });
}

template <typename Params, typename Launch>
void launch(int64_t n, LlamaElem elem, const char* name, const Launch& go) {
  const int64_t blocks = llama_blocks(n);
  if (blocks == 0) return;
  const auto grid = static_cast<unsigned>(blocks);
  switch (elem) {
    case LlamaElem::kF32:
      go(grid, std::integral_constant<LlamaElem, LlamaElem::kF32>{});
      break;
    case LlamaElem::kBf16:
      go(grid, std::integral_constant<LlamaElem, LlamaElem::kBf16>{});
      break;
    case LlamaElem::kF16:
      go(grid, std::integral_constant<LlamaElem, LlamaElem::kF16>{});
      break;
  }
  ::tessel::cuda::check_launch(name, ::tessel::cuda::current_device());
}

}  // namespace

void launch_grouped_matmul(const GroupedMatmulParams& p, LlamaElem elem, cudaStream_t stream) {
  launch<GroupedMatmulParams>(
      p.rows * p.cols, elem, "grouped_matmul_cuda", [&](unsigned grid, auto e) {
        grouped_matmul_kernel<decltype(e)::value><<<grid, kLlamaThreads, 0, stream>>>(p);
      });
}

void launch_grouped_weight_grad(const GroupedWeightGradParams& p, LlamaElem elem,
                                cudaStream_t stream) {
  launch<GroupedWeightGradParams>(p.groups * p.inner * p.cols, elem,
                                  "grouped_matmul_cuda_weight_grad", [&](unsigned grid, auto e) {
                                    grouped_weight_grad_kernel<decltype(e)::value>
                                        <<<grid, kLlamaThreads, 0, stream>>>(p);
                                  });
}

}  // namespace tessel::kernels::cuda
