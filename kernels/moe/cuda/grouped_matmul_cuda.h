#pragma once
// The grouped matmul of a mixture of experts on CUDA (grouped_matmul_cuda.cu): forward, the
// input gradient and the weight gradient as one kernel each, f32 accumulation, for f32, bf16 and
// f16. kernels::grouped_matmul (grouped_matmul.h) calls them for CUDA tensors; in a build
// without CUDA a stub stands in (grouped_matmul_cuda_stub.cc) and reports itself unavailable.

#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

// True when this build has the CUDA kernel.
bool grouped_matmul_cuda_is_available();

// out (M, N) = x_g @ w[g] per group (transpose_w: x (M, N) and out (M, K) = x_g @ w[g]^T, the
// input gradient), with x, w (G, K, N), out contiguous of one floating dtype and offsets
// (G + 1) i64 contiguous, all on one CUDA device. Issues one kernel on the device's current
// stream and returns without waiting. Throws InvalidArgument for other shapes, dtypes, layouts
// or devices, Unavailable without CUDA.
void grouped_matmul_cuda(const Tensor& x, const Tensor& w, const Tensor& offsets, bool transpose_w,
                         const Tensor& out);

// dw (G, K, N) = x_g^T @ dy_g per group (zeros for an empty group), x (M, K), dy (M, N).
// Stream and errors as grouped_matmul_cuda.
void grouped_matmul_cuda_weight_grad(const Tensor& x, const Tensor& dy, const Tensor& offsets,
                                     const Tensor& dw);

}  // namespace tessel::kernels
