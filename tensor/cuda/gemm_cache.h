#pragma once
// Private: what the CUDA matmul keeps between calls so a GEMM it has seen costs no cuBLASLt
// setup: a key of every scalar of the problem (plan_gemm's shapes, leading dims, batch strides
// and transposes; dtypes; TF32; epilogue; operand alignment; device) and a bounded cache of
// entries under it (base/lru_cache.h), forgetting the least recently used one when full. Plain C++,
// tested on the CPU (tests/tensor/gemm_cache_test.cc); cuda_matmul.cc stores its descriptor,
// layouts and heuristic result per key.
//
// Not thread-safe: the matmul keeps one cache per thread (an entry's descriptor takes the bias
// pointer of the call in hand).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessel/base/lru_cache.h"
#include "tessel/tensor/cuda/cuda_gemm_plan.h"
#include "tessel/tensor/dtype.h"

namespace tessel::cuda {

// The problem's scalars beyond the plan.
struct GemmKeyParts {
  int device = 0;
  DType ab_dtype = DType::kF32, d_dtype = DType::kF32;
  bool tf32 = false;
  int epilogue = 0;  // cublasLtEpilogue_t
  DType bias_dtype = DType::kF32;
  uint32_t align_a = 0, align_b = 0, align_d = 0, align_bias = 0;
};

using GemmKey = std::vector<int64_t>;
struct GemmKeyHash {
  size_t operator()(const GemmKey& key) const;
};

// Equal keys: the same cuBLASLt problem; any difference in the plan or the parts: another key.
GemmKey gemm_key(const GemmPlan& plan, const GemmKeyParts& parts);

using GemmCacheCounts = LruCacheCounts;

// The calling thread's matmul cache so far (defined where the build has CUDA: cuda_matmul.cc).
GemmCacheCounts thread_gemm_cache_counts();

// At most `capacity` entries under GemmKeys; the least recently used one goes first.
template <typename V>
using GemmCache = LruCache<GemmKey, V, GemmKeyHash>;

}  // namespace tessel::cuda
