#include "tessel/collectives/internal/strided_copy.h"

#include <array>
#include <cstring>

#include "tessel/base/error.h"

namespace tessel::internal {
namespace {

constexpr int kMaxDims = 16;

// A view as rows: `dims` outer dimensions (sizes and byte strides, innermost last) over rows of
// `row` elements that are `step` bytes apart (step == element size: a contiguous run). Size-1
// dimensions are dropped and dimensions that continue each other are merged, so a contiguous
// view is one row.
struct Rows {
  char* base = nullptr;
  int64_t element = 0;
  int64_t row = 1, step = 0;
  int dims = 0;
  std::array<int64_t, kMaxDims> size{}, stride{};
};

Rows rows_of(const Tensor& view) {
  Rows r;
  r.element = static_cast<int64_t>(view.element_size());
  r.base = static_cast<char*>(view.data_ptr());
  std::array<int64_t, kMaxDims + 1> size{}, stride{};
  int n = 0;
  for (int64_t d = 0; d < view.dim(); ++d) {
    const int64_t s = view.size(d);
    const int64_t st = view.strides()[static_cast<size_t>(d)] * r.element;
    if (s == 1) continue;
    if (n > 0 && stride[n - 1] == s * st) {  // dimension n-1 steps over whole runs of this one
      size[n - 1] *= s;
      stride[n - 1] = st;
      continue;
    }
    TESSEL_CHECK(n <= kMaxDims, InvalidArgument, "a view of {} dimensions is too deep to pack",
                 view.dim());
    size[n] = s;
    stride[n] = st;
    ++n;
  }
  if (n == 0) {  // one element
    r.step = r.element;
    return r;
  }
  r.row = size[n - 1];
  r.step = stride[n - 1];
  r.dims = n - 1;
  for (int i = 0; i < r.dims; ++i) {
    r.size[i] = size[i];
    r.stride[i] = stride[i];
  }
  return r;
}

// Calls f(address, elements) for each run of row elements in [first, first + count).
template <typename F>
void for_each_run(const Rows& r, int64_t first, int64_t count, F&& f) {
  if (count <= 0) return;
  // The multi-index of `first` over the outer dimensions, and its offset in the row.
  std::array<int64_t, kMaxDims> index{};
  int64_t outer = first / r.row, col = first % r.row;
  char* p = r.base + col * r.step;
  for (int i = r.dims - 1; i >= 0; --i) {
    index[i] = outer % r.size[i];
    outer /= r.size[i];
    p += index[i] * r.stride[i];
  }
  while (count > 0) {
    const int64_t n = std::min(r.row - col, count);
    f(p, n);
    count -= n;
    p -= col * r.step;
    col = 0;
    // Next row: carry through the outer dimensions.
    for (int i = r.dims - 1; i >= 0; --i) {
      p += r.stride[i];
      if (++index[i] < r.size[i]) break;
      p -= index[i] * r.stride[i];
      index[i] = 0;
    }
  }
}

}  // namespace

void pack_elements(const Tensor& view, int64_t first, int64_t count, void* dst) {
  const Rows r = rows_of(view);
  auto* out = static_cast<char*>(dst);
  if (r.step == r.element) {
    for_each_run(r, first, count, [&](const char* p, int64_t n) {
      std::memcpy(out, p, static_cast<size_t>(n * r.element));
      out += n * r.element;
    });
    return;
  }
  for_each_run(r, first, count, [&](const char* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i, out += r.element) {
      std::memcpy(out, p + i * r.step, static_cast<size_t>(r.element));
    }
  });
}

void unpack_elements(const void* src, const Tensor& view, int64_t first, int64_t count) {
  const Rows r = rows_of(view);
  const auto* in = static_cast<const char*>(src);
  if (r.step == r.element) {
    for_each_run(r, first, count, [&](char* p, int64_t n) {
      std::memcpy(p, in, static_cast<size_t>(n * r.element));
      in += n * r.element;
    });
    return;
  }
  for_each_run(r, first, count, [&](char* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i, in += r.element) {
      std::memcpy(p + i * r.step, in, static_cast<size_t>(r.element));
    }
  });
}

}  // namespace tessel::internal
