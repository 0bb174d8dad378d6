#pragma once
// Private: how CUDA kernels address strided operands. An Indexer maps the row-major position of
// an element of one shape to the element offset of that element in each of N operands (views
// with their own strides; 0 broadcasts). The host builds it once per kernel call, dropping
// size-1 dims and merging dims that are contiguous for every operand (as the CPU's
// for_each_strided does), so most calls reach the kernels with one or two dims. Plain C++
// with __host__ __device__ members: the index arithmetic is tested on the CPU
// (tests/tensor/cuda_indexer_test.cc).

#include <array>
#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define TESSEL_HOST_DEVICE __host__ __device__
#else
#define TESSEL_HOST_DEVICE
#endif

namespace tessel::cuda {

// Dims an indexer keeps after merging; a view needing more is refused (InvalidArgument).
inline constexpr int kMaxDims = 16;

template <int N>
struct Indexer {
  int rank = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // in elements

  // Offsets (in elements) of the element at row-major position `linear` in each operand.
  // IndexT is uint32_t when every position and offset fits (the launcher checks), which makes
  // the divisions cheap on the device.
  template <typename IndexT>
  TESSEL_HOST_DEVICE void offsets(IndexT linear, IndexT (&out)[N]) const {
    if (rank == 1) {  // the common case after merging: no division at all
      for (int k = 0; k < N; ++k) out[k] = linear * static_cast<IndexT>(strides[k][0]);
      return;
    }
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const IndexT size = static_cast<IndexT>(sizes[d]);
      const IndexT i = linear % size;
      linear /= size;
      for (int k = 0; k < N; ++k) out[k] += i * static_cast<IndexT>(strides[k][d]);
    }
  }

  // Whether every position below `numel` and every offset fits in 31 bits.
  bool fits_32bit(int64_t numel) const {
    constexpr int64_t kLimit = int64_t{1} << 31;
    if (numel >= kLimit) return false;
    for (int k = 0; k < N; ++k) {
      int64_t reach = 0;
      for (int d = 0; d < rank; ++d) reach += (sizes[d] - 1) * strides[k][d];
      if (reach >= kLimit) return false;
    }
    return true;
  }
};

// Builds the Indexer of N operands of `shape` (row-major positions), given each operand's
// strides (in elements, one per dim of `shape`). Throws InvalidArgument when more than
// kMaxDims dims remain after merging, or when a stride is negative.
template <int N>
Indexer<N> make_indexer(const std::vector<int64_t>& shape,
                        const std::array<const std::vector<int64_t>*, N>& strides);

extern template Indexer<1> make_indexer<1>(const std::vector<int64_t>&,
                                           const std::array<const std::vector<int64_t>*, 1>&);
extern template Indexer<2> make_indexer<2>(const std::vector<int64_t>&,
                                           const std::array<const std::vector<int64_t>*, 2>&);
extern template Indexer<3> make_indexer<3>(const std::vector<int64_t>&,
                                           const std::array<const std::vector<int64_t>*, 3>&);
extern template Indexer<4> make_indexer<4>(const std::vector<int64_t>&,
                                           const std::array<const std::vector<int64_t>*, 4>&);

}  // namespace tessel::cuda
