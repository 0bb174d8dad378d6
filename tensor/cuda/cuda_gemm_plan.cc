#include "tessel/tensor/cuda/cuda_gemm_plan.h"

#include "tessel/base/error.h"

namespace tessel::cuda {
namespace {

// a's batch dims and rows as one run of rows at a's row stride, with b the same matrix for
// every batch: the product is one 2-D GEMM with batch * M rows.
bool folds_into_rows(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t nb = out.dim() - 2;
  for (int64_t d = 0; d < nb; ++d) {
    if (b.shape()[d] != 1 && out.shape()[d] != 1) return false;  // b varies over the batch
    if (a.shape()[d] != out.shape()[d]) return false;            // a broadcasts
  }
  const int64_t M = a.size(-2), K = a.size(-1);
  if (!(a.stride(-1) == 1 || K == 1) || a.stride(-2) < K) return false;  // a must be row-major
  int64_t expected = a.stride(-2) * M;
  for (int64_t d = nb - 1; d >= 0; --d) {
    if (a.shape()[d] == 1) continue;
    if (a.strides()[d] != expected) return false;
    expected *= a.shape()[d];
  }
  return true;
}

}  // namespace

GemmOperand transposed_operand(int64_t R, int64_t C, int64_t s0, int64_t s1) {
  if ((s1 == 1 || C == 1) && (s0 >= C || R == 1)) {  // row-major: memory is [C, R] col-major
    return {false, C, R, R == 1 ? C : s0};
  }
  if ((s0 == 1 || R == 1) && (s1 >= R || C == 1)) {  // column-major: memory is [R, C] col-major
    return {true, R, C, C == 1 ? R : s1};
  }
  throw Internal(
      fmt::format("matmul: an operand of shape ({}, {}) with strides ({}, {}) is "
                  "neither row- nor column-major",
                  R, C, s0, s1));
}

GemmPlan plan_gemm(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  GemmPlan p;
  p.m = N;
  p.k = K;
  p.ldd = N;
  p.A = transposed_operand(K, N, b.stride(-2), b.stride(-1));
  if (out.dim() == 2 || folds_into_rows(a, b, out)) {
    const int64_t rows = out.numel() / N;
    p.n = rows;
    p.B = transposed_operand(rows, K, a.stride(-2), a.stride(-1));
    return p;
  }
  // The batch dims, innermost first, must chain into one stride per operand.
  bool first = true;
  for (int64_t d = out.dim() - 3; d >= 0; --d) {
    const int64_t size = out.shape()[d];
    if (size == 1) continue;
    const int64_t sa = a.shape()[d] == 1 ? 0 : a.strides()[d];
    const int64_t sb = b.shape()[d] == 1 ? 0 : b.strides()[d];
    const int64_t so = out.strides()[d];
    if (first) {
      p.batch = size;
      p.stride_a = sb;  // cuBLASLt's A is our b
      p.stride_b = sa;
      p.stride_d = so;
      first = false;
    } else if (sb == p.stride_a * p.batch && sa == p.stride_b * p.batch &&
               so == p.stride_d * p.batch) {
      p.batch *= size;
    } else {
      p.dense = true;
      return p;
    }
  }
  p.n = M;
  p.B = transposed_operand(M, K, a.stride(-2), a.stride(-1));
  return p;
}

Tensor batch_expanded(const Tensor& t, const Tensor& out) {
  Shape shape(out.shape().begin(), out.shape().end() - 2);
  Strides strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    strides.push_back(t.shape()[d] == 1 ? 0 : t.strides()[d]);
  }
  shape.push_back(t.size(-2));
  shape.push_back(t.size(-1));
  strides.push_back(t.stride(-2));
  strides.push_back(t.stride(-1));
  return t.as_strided(shape, strides, t.offset());
}

}  // namespace tessel::cuda
