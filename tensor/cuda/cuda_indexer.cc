#include "tessel/tensor/cuda/cuda_indexer.h"

#include "tessel/base/error.h"

namespace tessel::cuda {

template <int N>
Indexer<N> make_indexer(const std::vector<int64_t>& shape,
                        const std::array<const std::vector<int64_t>*, N>& strides) {
  // Merge from the innermost dim outwards: dim d joins the run inside it when, for every
  // operand, stepping d once equals stepping the whole run.
  std::vector<int64_t> sizes;
  std::array<std::vector<int64_t>, N> st;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    for (int k = 0; k < N; ++k) {
      TESSEL_CHECK((*strides[k])[d] >= 0, InvalidArgument,
                   "CUDA kernels take views with non-negative strides, got stride {} in dim {}",
                   (*strides[k])[d], d);
    }
    bool merge = !sizes.empty();
    for (int k = 0; k < N && merge; ++k) {
      merge = (*strides[k])[d] == st[k].back() * sizes.back();
    }
    if (merge) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      for (int k = 0; k < N; ++k) st[k].push_back((*strides[k])[d]);
    }
  }
  if (sizes.empty()) {  // a single element
    sizes.push_back(1);
    for (int k = 0; k < N; ++k) st[k].push_back(0);
  }
  TESSEL_CHECK(static_cast<int>(sizes.size()) <= kMaxDims, InvalidArgument,
               "CUDA kernels take views of at most {} non-mergeable dims, got {} (make the "
               "tensor contiguous first)",
               kMaxDims, sizes.size());
  Indexer<N> ix;
  ix.rank = static_cast<int>(sizes.size());
  // sizes/st were collected innermost first; the indexer keeps row-major order.
  for (int d = 0; d < ix.rank; ++d) {
    const int from = ix.rank - 1 - d;
    ix.sizes[d] = sizes[from];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = st[k][from];
  }
  return ix;
}

template Indexer<1> make_indexer<1>(const std::vector<int64_t>&,
                                    const std::array<const std::vector<int64_t>*, 1>&);
template Indexer<2> make_indexer<2>(const std::vector<int64_t>&,
                                    const std::array<const std::vector<int64_t>*, 2>&);
template Indexer<3> make_indexer<3>(const std::vector<int64_t>&,
                                    const std::array<const std::vector<int64_t>*, 3>&);
template Indexer<4> make_indexer<4>(const std::vector<int64_t>&,
                                    const std::array<const std::vector<int64_t>*, 4>&);

}  // namespace tessel::cuda
