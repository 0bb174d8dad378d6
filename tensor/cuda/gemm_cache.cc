#include "tessel/tensor/cuda/gemm_cache.h"

namespace tessel::cuda {

size_t GemmKeyHash::operator()(const GemmKey& key) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
  for (int64_t x : key) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
  return static_cast<size_t>(h);
}

GemmKey gemm_key(const GemmPlan& p, const GemmKeyParts& parts) {
  return {parts.device,
          static_cast<int64_t>(parts.ab_dtype),
          static_cast<int64_t>(parts.d_dtype),
          parts.tf32,
          p.A.transpose,
          p.B.transpose,
          p.A.rows,
          p.A.cols,
          p.A.ld,
          p.B.rows,
          p.B.cols,
          p.B.ld,
          p.m,
          p.n,
          p.k,
          p.ldd,
          p.batch,
          p.stride_a,
          p.stride_b,
          p.stride_d,
          parts.epilogue,
          static_cast<int64_t>(parts.bias_dtype),
          parts.align_a,
          parts.align_b,
          parts.align_d,
          parts.align_bias};
}

}  // namespace tessel::cuda
