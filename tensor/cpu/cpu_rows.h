#pragma once
// Private: row-wise CPU kernels' helpers (softmax, norms, cross-entropy): rows in parallel
// chunks of about 16K elements, and rows of any floating dtype seen as f32 (16-bit rows are
// widened into a scratch row and narrowed back).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessel/tensor/cpu/cpu_vector.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::cpu {

// Rows per chunk so that a chunk touches about 16K elements.
inline int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
}

template <typename F>
void for_each_row(int64_t rows, int64_t cols, F f) {
  parallel_for(0, rows, row_grain(cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) f(r);
  });
}

// As for_each_row, with `buffers` scratch rows of `cols` floats per chunk: f(r, scratch).
template <typename F>
void for_each_row_scratch(int64_t rows, int64_t cols, int buffers, F f) {
  parallel_for(0, rows, row_grain(cols), [&](int64_t b, int64_t e) {
    std::vector<float> scratch(static_cast<size_t>(cols * buffers));
    for (int64_t r = b; r < e; ++r) f(r, scratch.data());
  });
}

// Row `src` (cols elements of T) as f32: the row itself for f32, else widened into buf.
template <typename T>
const float* row_f32(const T* src, int64_t cols, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    widen(src, buf, cols);
    return buf;
  }
}
// Where to compute an output row: the row itself for f32, else buf (then store_row).
template <typename T>
float* out_f32(T* dst, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return dst;
  } else {
    return buf;
  }
}
template <typename T>
void store_row(const float* row, T* dst, int64_t cols) {
  if constexpr (!std::is_same_v<T, float>) narrow(row, dst, cols);
}

}  // namespace tessel::cpu
