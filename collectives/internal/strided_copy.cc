#include "tessel/collectives/internal/strided_copy.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tessel/base/error.h"
#include "tessel/tensor/cpu/cpu_isa.h"

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

// A run of a few hundred bytes, the usual row of a column block: moved inline in 64-byte pieces
// and a tail of two overlapping moves (88 bytes: 64, then 16 twice), as a library memcpy call's
// dispatch would cost as much as the copy.
__attribute__((always_inline)) inline void copy_run(char* dst, const char* src, size_t bytes) {
  if (bytes > 1024) {
    std::memcpy(dst, src, bytes);
    return;
  }
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) __builtin_memcpy(dst + i, src + i, 64);
  const size_t tail = bytes - i;
  auto two = [&](auto width) {  // [i, i + width) and [bytes - width, bytes): they may overlap
    constexpr size_t w = decltype(width)::value;
    __builtin_memcpy(dst + i, src + i, w);
    __builtin_memcpy(dst + bytes - w, src + bytes - w, w);
  };
  if (tail >= 32) {
    two(std::integral_constant<size_t, 32>{});
  } else if (tail >= 16) {
    two(std::integral_constant<size_t, 16>{});
  } else if (tail >= 8) {
    two(std::integral_constant<size_t, 8>{});
  } else if (tail >= 4) {
    two(std::integral_constant<size_t, 4>{});
  } else {
    for (; i < bytes; ++i) dst[i] = src[i];
  }
}

#if defined(__x86_64__)
// A run of whole 16-byte pieces into 16-byte aligned memory, stored past the cache (a line
// written whole is then not read first). The caller fences (_mm_sfence) after its last one.
__attribute__((always_inline)) inline void stream_run(char* dst, const char* src, size_t bytes) {
  for (size_t k = 0; k < bytes; k += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
  }
}
#endif

// `rows` runs of `run` bytes, `pitch` bytes apart, packed into (or, with Unpack, out of)
// consecutive bytes at `packed`. Runs a few times shorter than their pitch (a column block: the
// blocks in between go to other peers or to this rank's own chunk next) prefetch whole rows
// ahead, so memory streams each row once rather than once per block. With `nt` (destination
// 16-byte aligned, runs of whole 16-byte pieces), the stores bypass the cache: a line written
// whole need not be read first, which a cached store does (a library memcpy into contiguous
// memory does not).
template <bool Unpack>
TESSEL_ISA_CLONES void copy_rows(char* packed, char* strided, int64_t rows, size_t run,
                                 int64_t pitch, bool nt, bool ahead) {
  const bool prefetch =
      ahead && pitch > static_cast<int64_t>(run) && pitch <= 8 * static_cast<int64_t>(run);
  constexpr int64_t kAhead = 8;  // rows
  for (int64_t i = 0; i < rows; ++i, packed += run, strided += pitch) {
    if (prefetch && !nt && i + kAhead < rows) {
      for (int64_t b = 0; b < pitch; b += 64)
        __builtin_prefetch(strided + kAhead * pitch + b, Unpack, 3);
    }
    char* d = Unpack ? strided : packed;
    const char* s = Unpack ? packed : strided;
#if defined(__x86_64__)
    if (nt) {
      stream_run(d, s, run);
      continue;
    }
#endif
    copy_run(d, s, run);
  }
#if defined(__x86_64__)
  if (nt) _mm_sfence();
#endif
}

// Elements [first, first + count) of a view of rows of contiguous runs (one outer dimension):
// the partial rows at the ends through copy_run, the whole rows between through copy_rows.
template <bool Unpack>
void copy_2d(const Rows& r, int64_t first, int64_t count, char* packed, bool stream) {
  const int64_t pitch = r.stride[0];
  const auto e = static_cast<size_t>(r.element);
  int64_t row = first / r.row, col = first % r.row;
  auto move = [&](int64_t n) {  // n elements from (row, col) on, within the row
    char* p = r.base + row * pitch + col * r.element;
    if (Unpack) {
      copy_run(p, packed, static_cast<size_t>(n) * e);
    } else {
      copy_run(packed, p, static_cast<size_t>(n) * e);
    }
    packed += static_cast<size_t>(n) * e;
  };
  if (col != 0) {
    const int64_t n = std::min(r.row - col, count);
    move(n);
    count -= n;
    ++row;
    col = 0;
  }
  const int64_t whole = count / r.row;
  if (whole > 0) {
    // Streaming stores into a view that would take over half this core's cache, or into
    // packed memory the caller says is a large result.
    const size_t run = static_cast<size_t>(r.row) * e;
    char* first_row = r.base + row * pitch;
    char* dst = Unpack ? first_row : packed;
    const bool nt =
        run % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
        (Unpack ? pitch % 16 == 0 && worth_streaming(static_cast<size_t>(r.size[0] * pitch))
                : stream);
    // Rows in cache already (a view spanning less) gain nothing from prefetching.
    const bool ahead = worth_streaming(static_cast<size_t>(r.size[0] * pitch));
    copy_rows<Unpack>(packed, first_row, whole, run, pitch, nt, ahead);
    packed += static_cast<size_t>(whole * r.row) * e;
    row += whole;
    count -= whole * r.row;
  }
  if (count > 0) move(count);
}

}  // namespace

size_t core_cache_bytes() {
  static const size_t bytes = [] {
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) : size_t{1} << 20;
  }();
  return bytes;
}

bool worth_streaming(size_t bytes) {
  // Measured on unpacking column blocks: streaming stores win from half the core's cache up
  // and lose below.
  return bytes > core_cache_bytes() / 2;
}

void pack_elements(const Tensor& view, int64_t first, int64_t count, void* dst, bool stream) {
  const Rows r = rows_of(view);
  auto* out = static_cast<char*>(dst);
  if (r.step == r.element && r.dims == 1) {
    copy_2d<false>(r, first, count, out, stream);
    return;
  }
  if (r.step == r.element) {
    for_each_run(r, first, count, [&](const char* p, int64_t n) {
      copy_run(out, p, static_cast<size_t>(n * r.element));
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
  if (r.step == r.element && r.dims == 1) {
    copy_2d<true>(r, first, count, const_cast<char*>(in), false);
    return;
  }
  if (r.step == r.element) {
    for_each_run(r, first, count, [&](char* p, int64_t n) {
      copy_run(p, in, static_cast<size_t>(n * r.element));
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

std::optional<RowRuns> row_runs(const Tensor& view) {
  const Rows r = rows_of(view);
  if (r.step != r.element || r.dims != 1) return std::nullopt;
  return RowRuns{r.base, r.size[0], static_cast<size_t>(r.row * r.element), r.stride[0]};
}

namespace {

TESSEL_ISA_CLONES void split_rows_impl(std::span<const RowRuns> views, int64_t first, int64_t count,
                                       std::span<RowSink> sinks, const char* lo, int64_t span,
                                       bool ahead) {
  constexpr int64_t kAhead = 8;  // rows
  const int64_t pitch = views[0].pitch;
  for (int64_t row = first; row < first + count; ++row) {
    if (ahead && row + kAhead < first + count) {
      for (int64_t b = 0; b < span; b += 64)
        __builtin_prefetch(lo + (row + kAhead) * pitch + b, 0, 3);
    }
    for (size_t j = 0; j < views.size(); ++j) {
      const char* src = views[j].base + row * pitch;
      const size_t run = views[j].run;
      RowSink& sink = sinks[j];
      char* dst = reinterpret_cast<char*>(sink.data) + sink.at;
      if (sink.size == 0) {
#if defined(__x86_64__)
        if (sink.stream && run % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
          stream_run(dst, src, run);
          sink.at += run;
          continue;
        }
#endif
        copy_run(dst, src, run);
        sink.at += run;
      } else if (sink.at + run <= sink.size) {
        copy_run(dst, src, run);
        sink.at = (sink.at + run) % sink.size;
      } else {  // the row straddles the ring's end
        const size_t head = sink.size - sink.at;
        std::memcpy(dst, src, head);
        std::memcpy(sink.data, src + head, run - head);
        sink.at = run - head;
      }
    }
  }
#if defined(__x86_64__)
  for (const RowSink& sink : sinks) {
    if (sink.stream) {
      _mm_sfence();
      break;
    }
  }
#endif
}

}  // namespace

void split_rows(std::span<const RowRuns> views, int64_t first, int64_t count,
                std::span<RowSink> sinks) {
  if (views.empty() || count <= 0) return;
  // The matrix row these views cut: from the lowest block's start to the highest block's end.
  const char* lo = views[0].base;
  const char* hi = views[0].base + views[0].run;
  for (const RowRuns& v : views) {
    lo = std::min(lo, v.base);
    hi = std::max(hi, v.base + v.run);
  }
  const int64_t span = hi - lo;
  const bool ahead =
      span <= 4096 && worth_streaming(static_cast<size_t>(views[0].rows * views[0].pitch));
  split_rows_impl(views, first, count, sinks, lo, span, ahead);
}

}  // namespace tessel::internal
