#pragma once
// The grouped matmul of a mixture of experts: the rows of x, sorted by expert, each multiplied
// by their own expert's weight in one differentiable call.

#include <cstdint>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

// out[offsets[g] : offsets[g+1]] = x[offsets[g] : offsets[g+1]] @ w[g] for every group g, with x
// (M, K), w (G, K, N), offsets G + 1 non-decreasing row indices from 0 to M (a group may be
// empty) -> out (M, N) in x's dtype. One autograd node: backward gives dx per group (dy @ w[g]^T)
// and dw[g] = x_g^T @ dy_g (zeros for an empty group).
//
// CPU (and any backend with matmul): the groups run in one call, each through the tensor
// library's GEMM path (tessel::matmul), which splits a group's rows over the thread pool; the
// result equals a per-group loop of matmul bit for bit. CUDA tensors (in a build with CUDA) take
// the kernels of cuda/grouped_matmul_cuda.h, one launch per product on the current stream, f32
// accumulation (not bit-equal to cuBLAS). Blocks on the CPU. Throws InvalidArgument naming the
// shapes or offsets when they do not fit.
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets);

}  // namespace tessel::kernels
