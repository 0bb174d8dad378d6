#pragma once
// The arguments of the grouped matmul on CUDA (grouped_matmul_cuda.cu) and its per-element
// bodies, written once for the device and the host so that tests run them on the CPU
// (tests/kernels/moe_cuda_emulated_test.cc). Element access and the grid-stride loop are the
// Llama kernels' (kernels/llama/cuda/internal/llama_cuda_params.h).

#include <cstdint>

#include "tessel/kernels/llama/cuda/internal/llama_cuda_params.h"

namespace tessel::kernels::cuda {

// out[m, n] = sum_k a[m, k] * b(g(m), k, n) over the rows m of a (M, K) contiguous, where g(m)
// is the group whose rows offsets[g] .. offsets[g+1] hold m and b's element (g, k, n) lies at
// g * b_group + k * b_inner + n * b_col (forward: w (G, K, N); the input gradient: w
// transposed, dy @ w[g]^T). One work item per output element, n fastest.
struct GroupedMatmulParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  const int64_t* offsets = nullptr;  // groups + 1 entries, on the device
  int64_t groups = 0, rows = 0, inner = 0, cols = 0;
  int64_t b_group = 0, b_inner = 0, b_col = 0;
};

// dw[g, k, n] = sum over group g's rows m of x[m, k] * dy[m, n], x (M, K) and dy (M, N)
// contiguous, dw (G, K, N) contiguous. One work item per element of dw.
struct GroupedWeightGradParams {
  const void* x = nullptr;
  const void* dy = nullptr;
  void* dw = nullptr;
  const int64_t* offsets = nullptr;
  int64_t groups = 0, inner = 0, cols = 0;
};

// The group holding row m: the last g with offsets[g] <= m (empty groups skipped), by bisection.
TESSEL_LLAMA_HD int64_t group_of_row(const int64_t* offsets, int64_t groups, int64_t m) {
  int64_t lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= m) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <LlamaElem E>
TESSEL_LLAMA_HD void grouped_matmul_at(const GroupedMatmulParams& p, int64_t i) {
  const int64_t m = i / p.cols, n = i % p.cols;
  const int64_t g = group_of_row(p.offsets, p.groups, m);
  float acc = 0.0f;
  for (int64_t k = 0; k < p.inner; ++k) {
    acc += load_elem<E>(p.a, m * p.inner + k) *
           load_elem<E>(p.b, g * p.b_group + k * p.b_inner + n * p.b_col);
  }
  store_elem<E>(p.out, i, acc);
}

template <LlamaElem E>
TESSEL_LLAMA_HD void grouped_weight_grad_at(const GroupedWeightGradParams& p, int64_t i) {
  const int64_t n = i % p.cols, k = i / p.cols % p.inner, g = i / (p.cols * p.inner);
  float acc = 0.0f;
  for (int64_t m = p.offsets[g]; m < p.offsets[g + 1]; ++m) {
    acc += load_elem<E>(p.x, m * p.inner + k) * load_elem<E>(p.dy, m * p.cols + n);
  }
  store_elem<E>(p.dw, i, acc);
}

#if defined(__CUDACC__) || defined(TESSEL_LLAMA_CUDA_LAUNCHERS)
// Each issues one kernel on `stream` and nothing for an empty problem; throws the CUDA error of
// a failed launch.
void launch_grouped_matmul(const GroupedMatmulParams& p, LlamaElem elem, cudaStream_t stream);
void launch_grouped_weight_grad(const GroupedWeightGradParams& p, LlamaElem elem,
                                cudaStream_t stream);
#endif

}  // namespace tessel::kernels::cuda
