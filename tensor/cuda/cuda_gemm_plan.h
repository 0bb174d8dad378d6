#pragma once
// Private: how a tessel matmul (row-major [..., M, K] @ [..., K, N] -> [..., M, N], operands
// row- or column-major in their last two dims, batch dims equal or broadcast) becomes one
// cuBLASLt call, which is column-major: the output as a column-major [N, M] matrix is
// b^T a^T, so cuBLASLt's A is our b and its B our a, each passed with the op (none or
// transpose) that describes its memory. Plain C++ on shapes and strides: tested on the CPU by
// executing plans with a column-major reference GEMM (tests/tensor/cuda_gemm_plan_test.cc).

#include <cstdint>

#include "tessel/tensor/tensor.h"

namespace tessel::cuda {

// A column-major matrix layout (rows x cols, leading dim ld) and whether the GEMM transposes it.
struct GemmOperand {
  bool transpose = false;
  int64_t rows = 0, cols = 0, ld = 0;
};

// The row-major matrix [R, C] with element strides (s0, s1) (one of them 1: row- or
// column-major) as the cuBLASLt operand whose op yields its transpose [C, R]. Throws Internal
// for other layouts (the op makes operands fit before the backend sees them).
GemmOperand transposed_operand(int64_t R, int64_t C, int64_t s0, int64_t s1);

// D (m x n, column-major, leading dim ldd) = op(A) (m x k) op(B) (k x n), `batch` times; A is
// read from b's data, B from a's, D written to out's, each advanced by its batch stride (in
// elements). dense == true: the batch dims map onto no single stride per operand (the heads of
// a (B, T, H, D) view); make the operands contiguous in out's batch dims (batch_contiguous) and
// plan again.
struct GemmPlan {
  GemmOperand A, B;
  int64_t m = 0, n = 0, k = 0, ldd = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  bool dense = false;
};

// For a, b, out of one rank >= 2 as Backend::matmul takes them (out contiguous) and K > 0.
// A batch of rows times one matrix (x [B, T, C] @ W [C, N]) becomes one 2-D GEMM.
GemmPlan plan_gemm(const Tensor& a, const Tensor& b, const Tensor& out);

// The shape and strides of `t` (an operand of a product into `out`) viewed with out's batch
// dims (stride 0 where t broadcasts): copied into a contiguous tensor of that shape, it makes
// plan_gemm's dense case a single call.
Tensor batch_expanded(const Tensor& t, const Tensor& out);

}  // namespace tessel::cuda
