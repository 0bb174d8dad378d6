#pragma once
// Private helpers for the CPU kernels: dtype dispatch, conversions through the compute type
// (f32 for floating dtypes, i64 for integers and bool) and a strided N-operand loop that runs
// in parallel over contiguous runs of the innermost dimension.

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/tensor.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::cpu {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename T>
inline constexpr bool kIsFloat =
    std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

// The type arithmetic on T runs in.
template <typename T>
using Compute = std::conditional_t<kIsFloat<T>, float, int64_t>;

// Converts between any two element types (16-bit floats go through f32).
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<From, BFloat16> || std::is_same_v<From, Half>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16> || std::is_same_v<To, Half>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

// Calls f(TypeTag<T>{}) for the element type of `dtype`.
template <typename F>
decltype(auto) dispatch_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kBF16:
      return f(TypeTag<BFloat16>{});
    case DType::kF16:
      return f(TypeTag<Half>{});
    case DType::kI64:
      return f(TypeTag<int64_t>{});
    case DType::kI32:
      return f(TypeTag<int32_t>{});
    case DType::kBool:
      return f(TypeTag<bool>{});
  }
  throw Internal(fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

// As dispatch_all, for f32/bf16/f16 only; other dtypes throw InvalidArgument naming `what`.
template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kBF16:
      return f(TypeTag<BFloat16>{});
    case DType::kF16:
      return f(TypeTag<Half>{});
    default:
      break;
  }
  throw InvalidArgument(
      fmt::format("{} needs a floating-point tensor, got {}", what, dtype_name(dtype)));
}

// Elements per parallel chunk for cheap elementwise work.
inline constexpr int64_t kElementwiseGrain = 32768;

// Runs inner(ptrs, n, inner_strides) over every element of `shape` for N operands given by
// base pointers and strides in elements (scaled to bytes by elem_size). Each call covers n
// consecutive elements of the innermost (coalesced) dimension; ptrs point at the first one and
// inner_strides are that dimension's byte strides. Runs in parallel with the given grain.
template <size_t N, typename F>
void for_each_strided(const Shape& shape, std::array<char*, N> base,
                      std::array<const Strides*, N> strides, std::array<int64_t, N> elem_size,
                      int64_t grain, F&& inner) {
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return;
  // Drop size-1 dims and merge dims that are contiguous with the next for every operand.
  Shape dims;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = st[k].back() == (*strides[k])[d] * shape[d];
    }
    if (merge) {
      dims.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) st[k].back() = (*strides[k])[d];
    } else {
      dims.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) st[k].push_back((*strides[k])[d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < N; ++k) st[k].push_back(0);
  }
  for (size_t k = 0; k < N; ++k) {
    for (int64_t& s : st[k]) s *= elem_size[k];
  }
  const int rank = static_cast<int>(dims.size());
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = st[k][rank - 1];

  parallel_for(0, numel, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(rank);
    int64_t rem = begin;
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = rem % dims[d];
      rem /= dims[d];
    }
    std::array<char*, N> p = base;
    for (size_t k = 0; k < N; ++k) {
      for (int d = 0; d < rank; ++d) p[k] += idx[d] * st[k][d];
    }
    int64_t pos = begin;
    while (pos < end) {
      const int64_t n = std::min(dims[rank - 1] - idx[rank - 1], end - pos);
      inner(p, n, inner_strides);
      pos += n;
      idx[rank - 1] += n;
      for (size_t k = 0; k < N; ++k) p[k] += n * st[k][rank - 1];
      for (int d = rank - 1; d > 0 && idx[d] == dims[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (size_t k = 0; k < N; ++k) p[k] += st[k][d - 1] - dims[d] * st[k][d];
      }
    }
  });
}

// Pointer to the first element of t as char* (for for_each_strided).
inline char* base_ptr(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace tessel::cpu
