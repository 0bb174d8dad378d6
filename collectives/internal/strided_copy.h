#pragma once
// Private: copies between a strided view and contiguous bytes, for backends that move views
// (the list form of all_to_all). Elements are taken in row-major order of the view, so a range
// [first, first + count) of them is a byte range of the view's packed form; a backend can pack
// and send, or receive and unpack, a view piece by piece. Single-threaded on purpose: it runs
// beside the transport's threads, which a thread pool would compete with.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "tessel/tensor/tensor.h"

namespace tessel::internal {

// Elements [first, first + count) of `view` (row-major order, any strides; CPU) into `dst`.
// `stream`: dst is part of a large result the caller will not read back soon, so whole lines
// may be stored past the cache (see worth_streaming).
void pack_elements(const Tensor& view, int64_t first, int64_t count, void* dst,
                   bool stream = false);
// This core's own (L2) cache, from the system (1 MiB when it does not say).
size_t core_cache_bytes();
// True when a copy into `bytes` of memory is better made with stores that bypass the cache (a
// line written whole then need not be read first): from half this core's cache up. Unpacking
// into a view that spans more decides so by itself.
bool worth_streaming(size_t bytes);
// `count` elements from `src` into elements [first, first + count) of `view`.
void unpack_elements(const void* src, const Tensor& view, int64_t first, int64_t count);

// A view whose elements are `rows` runs of `run` bytes, `pitch` bytes apart: a block of columns
// of a matrix (or of rows of any contiguous tensor). row_runs() gives nullopt for other views.
struct RowRuns {
  const char* base = nullptr;
  int64_t rows = 0;
  size_t run = 0;
  int64_t pitch = 0;
};
std::optional<RowRuns> row_runs(const Tensor& view);

// Where split_rows writes one view's rows: consecutive bytes from `at`, in a ring of `size`
// bytes at `data` (wrapping to its start; a row may straddle the end), or straight on from
// data + at when size is 0. `stream`: a large result, stored past the cache where aligned.
struct RowSink {
  uint8_t* data = nullptr;
  size_t size = 0;
  size_t at = 0;
  bool stream = false;
};

// Rows [first, first + count) of views that share their rows (the same count and pitch:
// column blocks of one matrix), each into its sink, in one pass: a row of the matrix is read
// once, for all its blocks, rather than once per block. Advances each sink's `at`.
void split_rows(std::span<const RowRuns> views, int64_t first, int64_t count,
                std::span<RowSink> sinks);

}  // namespace tessel::internal
