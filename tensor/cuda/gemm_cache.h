#pragma once
// Private: what the CUDA matmul keeps between calls so a GEMM it has seen costs no cuBLASLt
// setup: a key of every scalar of the problem (plan_gemm's shapes, leading dims, batch strides
// and transposes; dtypes; TF32; epilogue; operand alignment; device) and a bounded cache of
// entries under it, forgetting the least recently used one when full. Plain C++, tested on the
// CPU (tests/tensor/gemm_cache_test.cc); cuda_matmul.cc stores its descriptor, layouts and
// heuristic result per key.
//
// Not thread-safe: the matmul keeps one cache per thread (an entry's descriptor takes the bias
// pointer of the call in hand).

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

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

struct GemmCacheCounts {
  int64_t hits = 0, misses = 0, evictions = 0;
};

// The calling thread's matmul cache so far (defined where the build has CUDA: cuda_matmul.cc).
GemmCacheCounts thread_gemm_cache_counts();

// At most `capacity` entries under GemmKeys; the least recently used one goes first.
template <typename V>
class GemmCache {
 public:
  using Counts = GemmCacheCounts;

  explicit GemmCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The entry of `key` (now the most recently used), or nullptr (a miss).
  V* find(const GemmKey& key) {
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++counts_.misses;
      return nullptr;
    }
    ++counts_.hits;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Stores `value` under a key find() missed; evicts the least recently used entry when full.
  V& insert(GemmKey key, V value) {
    if (index_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++counts_.evictions;
    }
    order_.emplace_front(std::move(key), std::move(value));
    index_.emplace(order_.front().first, order_.begin());
    return order_.front().second;
  }
  size_t size() const { return index_.size(); }
  const Counts& counts() const { return counts_; }

 private:
  using Entries = std::list<std::pair<GemmKey, V>>;
  const size_t capacity_;
  Entries order_;  // most recently used first
  std::unordered_map<GemmKey, typename Entries::iterator, GemmKeyHash> index_;
  Counts counts_;
};

}  // namespace tessel::cuda
