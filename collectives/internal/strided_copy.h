#pragma once
// Private: copies between a strided view and contiguous bytes, for backends that move views
// (the list form of all_to_all). Elements are taken in row-major order of the view, so a range
// [first, first + count) of them is a byte range of the view's packed form; a backend can pack
// and send, or receive and unpack, a view piece by piece. Single-threaded on purpose: it runs
// beside the transport's threads, which a thread pool would compete with.

#include <cstddef>
#include <cstdint>

#include "tessel/tensor/tensor.h"

namespace tessel::internal {

// Elements [first, first + count) of `view` (row-major order, any strides; CPU) into `dst`.
// `stream`: dst is part of a large result the caller will not read back soon, so whole lines
// may be stored past the cache (see worth_streaming).
void pack_elements(const Tensor& view, int64_t first, int64_t count, void* dst,
                   bool stream = false);
// True when a copy into `bytes` of memory is better made with stores that bypass the cache (a
// line written whole then need not be read first): from half this core's cache up. Unpacking
// into a view that spans more decides so by itself.
bool worth_streaming(size_t bytes);
// `count` elements from `src` into elements [first, first + count) of `view`.
void unpack_elements(const void* src, const Tensor& view, int64_t first, int64_t count);

}  // namespace tessel::internal
