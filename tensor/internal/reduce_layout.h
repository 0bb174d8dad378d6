#pragma once
// Private: how the CPU and CUDA backends lay out a reduction over `dims` as a 2-D problem:
// rows (the reduced dims trail a contiguous x: one row of R elements per output), columns
// (they lead it: output j combines x[i * outputs + j]), or rows of a copy made with the reduced
// dims moved last.

#include <algorithm>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::internal {

enum class ReduceLayout { kRows, kColumns, kCopyToRows };

inline bool dims_are_suffix(const std::vector<int64_t>& dims, int64_t rank) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[dims.size() - 1 - i] != rank - 1 - static_cast<int64_t>(i)) return false;
  }
  return true;
}

inline bool dims_are_prefix(const std::vector<int64_t>& dims) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// `dims` sorted and unique.
inline ReduceLayout reduce_layout_of(const Tensor& x, const std::vector<int64_t>& dims) {
  if (x.is_contiguous() && dims_are_suffix(dims, x.dim())) return ReduceLayout::kRows;
  if (x.is_contiguous() && dims_are_prefix(dims)) return ReduceLayout::kColumns;
  return ReduceLayout::kCopyToRows;
}

// x viewed with its other dims first (in order) and `dims` last: a contiguous copy of it has one
// row per output, in the output's order.
inline Tensor reduced_dims_last(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!std::binary_search(dims.begin(), dims.end(), d)) order.push_back(d);
  }
  order.insert(order.end(), dims.begin(), dims.end());
  Shape shape;
  Strides strides;
  for (int64_t d : order) {
    shape.push_back(x.shape()[d]);
    strides.push_back(x.strides()[d]);
  }
  return x.as_strided(shape, strides, x.offset());
}

}  // namespace tessel::internal
