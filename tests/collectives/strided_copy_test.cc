// pack_elements / unpack_elements (collectives/internal/strided_copy.h) against contiguous():
// every view kind the list form of all_to_all moves (narrowed columns, transposed, permuted 3-D
// views, size-1 dimensions, a scalar, empty ones, column blocks large enough for the prefetching
// and streaming-store paths), whole and in ranges that start and end mid-row, in every dtype
// size.

#include "tessel/collectives/internal/strided_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

// Views of a fresh base tensor of `dtype` (values 0, 1, 2, ... converted), each named.
struct ViewCase {
  std::string name;
  std::function<Tensor(const Tensor&)> make;  // base -> view
  Shape base;
};

std::vector<ViewCase> cases() {
  return {
      {"contiguous", [](const Tensor& b) { return b; }, {5, 7}},
      {"columns", [](const Tensor& b) { return narrow(b, 1, 2, 3); }, {6, 8}},
      {"rows", [](const Tensor& b) { return narrow(b, 0, 1, 3); }, {6, 8}},
      {"transposed", [](const Tensor& b) { return transpose(b, 0, 1); }, {5, 7}},
      {"permuted 3-D, narrowed",
       [](const Tensor& b) {
         return narrow(permute(b, {2, 0, 1}), 1, 1, 2);
       },
       {4, 3, 5}},
      {"middle dimension narrowed", [](const Tensor& b) { return narrow(b, 1, 1, 2); }, {3, 4, 5}},
      {"size-1 dimensions", [](const Tensor& b) { return narrow(b, 2, 3, 1); }, {1, 6, 5}},
      {"every other column", [](const Tensor& b) { return slice(b, 1, 0, 7, 2); }, {4, 7}},
      {"scalar", [](const Tensor& b) { return select(b, 0, 2); }, {4}},
      {"empty", [](const Tensor& b) { return narrow(b, 1, 2, 0); }, {3, 4}},
      // Larger than half a core's cache: prefetched rows, streaming stores where aligned.
      {"column block of a large matrix",
       [](const Tensor& b) { return narrow(b, 1, 32, 32); },
       {20000, 64}},
      {"odd column block of a large matrix",
       [](const Tensor& b) { return narrow(b, 1, 5, 19); },
       {9001, 37}},
  };
}

Tensor counting(const Shape& shape, DType dtype) {
  return to(view(arange(shape_numel(shape), DType::kI64), shape), dtype);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = contiguous(t);
  const auto* p = static_cast<const uint8_t*>(c.numel() > 0 ? c.data_ptr() : nullptr);
  return p == nullptr ? std::vector<uint8_t>{} : std::vector<uint8_t>(p, p + c.nbytes());
}

// Ranges [first, first + count) covering the view: whole, and in pieces of `piece` elements.
std::vector<std::pair<int64_t, int64_t>> ranges(int64_t numel, int64_t piece) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t first = 0; first < numel; first += piece) {
    out.emplace_back(first, std::min(piece, numel - first));
  }
  return out;
}

class StridedCopyTest : public ::testing::TestWithParam<DType> {};

TEST_P(StridedCopyTest, PackMatchesContiguousInAnyRanges) {
  const DType dtype = GetParam();
  for (const ViewCase& c : cases()) {
    const Tensor v = c.make(counting(c.base, dtype));
    const std::vector<uint8_t> want = bytes_of(v);
    for (int64_t piece : {int64_t{1}, int64_t{2}, int64_t{5}, std::max<int64_t>(v.numel(), 1)}) {
      for (bool stream : {false, true}) {
        std::vector<uint8_t> got(want.size(), 0xee);
        for (const auto& [first, count] : ranges(v.numel(), piece)) {
          internal::pack_elements(
              v, first, count, got.data() + first * static_cast<int64_t>(v.element_size()), stream);
        }
        EXPECT_EQ(got, want) << c.name << ", pieces of " << piece << ", stream " << stream;
      }
    }
  }
}

TEST_P(StridedCopyTest, UnpackWritesTheViewAndNothingElse) {
  const DType dtype = GetParam();
  for (const ViewCase& c : cases()) {
    for (int64_t piece : {int64_t{1}, int64_t{3}, int64_t{1} << 20}) {
      Tensor base = zeros(c.base, dtype);
      const Tensor v = c.make(base);
      const Tensor source = counting({v.numel()}, dtype);
      const auto* src = static_cast<const uint8_t*>(v.numel() > 0 ? source.data_ptr() : nullptr);
      for (const auto& [first, count] : ranges(v.numel(), piece)) {
        internal::unpack_elements(src + first * static_cast<int64_t>(v.element_size()), v, first,
                                  count);
      }
      // The view holds the source in row-major order; the rest of the base is still zero.
      EXPECT_EQ(bytes_of(v), bytes_of(source)) << c.name << ", pieces of " << piece;
      Tensor expected = zeros(c.base, dtype);
      copy_(c.make(expected), view(source, v.shape()));
      EXPECT_EQ(bytes_of(base), bytes_of(expected)) << c.name << ", pieces of " << piece;
    }
  }
}

// split_rows: the column blocks of a matrix, rows [first, first + count) in pieces, into a
// small ring (rows straddle its end; read back after each piece) and into contiguous memory,
// as pack_elements would.
TEST_P(StridedCopyTest, SplitRowsMatchesPackingEachBlock) {
  const DType dtype = GetParam();
  const int64_t rows = 3001, widths[] = {5, 11, 7};
  const Tensor matrix = counting({rows, 23}, dtype);
  std::vector<Tensor> blocks;
  std::vector<internal::RowRuns> views;
  int64_t at = 0;
  for (int64_t w : widths) {
    blocks.push_back(narrow(matrix, 1, at, w));
    at += w;
    const auto runs = internal::row_runs(blocks.back());
    ASSERT_TRUE(runs.has_value());
    views.push_back(*runs);
  }
  ASSERT_FALSE(internal::row_runs(matrix).has_value()) << "a contiguous matrix is one run";
  // Not a multiple of any dtype's row of block 1, and larger than a piece of its rows.
  const size_t ring_bytes = 10000;
  for (int64_t piece : {int64_t{1}, int64_t{7}, int64_t{97}}) {
    std::vector<std::vector<uint8_t>> got(3);
    std::vector<uint8_t> ring(ring_bytes);
    std::vector<internal::RowSink> sinks(3);
    got[0].resize(bytes_of(blocks[0]).size());
    got[2].resize(bytes_of(blocks[2]).size());
    sinks[0] = {got[0].data(), 0, 0, false};
    sinks[1] = {ring.data(), ring_bytes, 0, false};
    sinks[2] = {got[2].data(), 0, 0, true};  // streaming stores where aligned
    size_t taken = 0;  // block 1's bytes so far, read back out of the ring after each piece
    for (int64_t first = 0; first < rows; first += piece) {
      const int64_t count = std::min(piece, rows - first);
      internal::split_rows(views, first, count, sinks);
      const size_t n = static_cast<size_t>(count) * views[1].run;
      for (size_t k = 0; k < n; ++k) got[1].push_back(ring[(taken + k) % ring_bytes]);
      taken += n;
    }
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(got[j], bytes_of(blocks[j])) << "block " << j << ", pieces of " << piece;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, StridedCopyTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kI64, DType::kBool),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace tessel
