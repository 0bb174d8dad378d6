// The index arithmetic of the CUDA kernels (tensor/cuda/cuda_indexer.h), run on the CPU: dims
// merge as the CPU loops merge them, and every element's offsets match a direct computation
// over random shapes and layouts (transposed, sliced, broadcast), in 32-bit and 64-bit
// arithmetic.
#include "tessel/tensor/cuda/cuda_indexer.h"

#include <gtest/gtest.h>

#include <random>

#include "tessel/base/error.h"

namespace tessel::cuda {
namespace {

using Vec = std::vector<int64_t>;

TEST(CudaIndexerTest, ContiguousOperandsMergeIntoOneDim) {
  const Vec shape = {4, 5, 6}, strides = {30, 6, 1};
  const Indexer<2> ix = make_indexer<2>(shape, {&strides, &strides});
  EXPECT_EQ(ix.rank, 1);
  EXPECT_EQ(ix.sizes[0], 120);
  EXPECT_EQ(ix.strides[0][0], 1);
  EXPECT_TRUE(ix.fits_32bit(120));
}

TEST(CudaIndexerTest, BroadcastAndSizeOneDimsAreHandled) {
  const Vec shape = {3, 1, 4}, a = {4, 99, 1}, bias = {0, 0, 1};  // bias row broadcast
  const Indexer<2> ix = make_indexer<2>(shape, {&a, &bias});
  EXPECT_EQ(ix.rank, 2);
  int64_t off[2];
  ix.offsets<int64_t>(9, off);  // element (2, 0, 1)
  EXPECT_EQ(off[0], 9);
  EXPECT_EQ(off[1], 1);
  const Vec scalar_shape = {}, none = {};
  const Indexer<1> one = make_indexer<1>(scalar_shape, {&none});
  EXPECT_EQ(one.rank, 1);
  EXPECT_EQ(one.sizes[0], 1);
}

TEST(CudaIndexerTest, OffsetsMatchADirectComputationForRandomLayouts) {
  std::mt19937_64 rng(5);
  for (int iteration = 0; iteration < 300; ++iteration) {
    const int rank = std::uniform_int_distribution<int>(0, 6)(rng);
    Vec shape(rank);
    int64_t numel = 1;
    for (auto& s : shape) {
      s = std::uniform_int_distribution<int64_t>(1, 5)(rng);
      numel *= s;
    }
    std::vector<Vec> strides(3, Vec(rank));
    for (auto& st : strides) {
      for (auto& v : st)
        v = std::uniform_int_distribution<int64_t>(0, 3)(rng) == 0
                ? 0
                : std::uniform_int_distribution<int64_t>(1, 40)(rng);
    }
    strides[2] = Vec(rank);  // one contiguous operand, as outputs are
    int64_t run = 1;
    for (int d = rank - 1; d >= 0; --d) {
      strides[2][d] = run;
      run *= shape[d];
    }
    const Indexer<3> ix = make_indexer<3>(shape, {&strides[0], &strides[1], &strides[2]});
    ASSERT_TRUE(ix.fits_32bit(numel));
    for (int64_t i = 0; i < numel; ++i) {
      int64_t want[3] = {0, 0, 0};
      int64_t rest = i;
      for (int d = rank - 1; d >= 0; --d) {
        const int64_t k = rest % shape[d];
        rest /= shape[d];
        for (int o = 0; o < 3; ++o) want[o] += k * strides[o][d];
      }
      int64_t got64[3];
      uint32_t got32[3];
      ix.offsets<int64_t>(i, got64);
      ix.offsets<uint32_t>(static_cast<uint32_t>(i), got32);
      for (int o = 0; o < 3; ++o) {
        ASSERT_EQ(got64[o], want[o]) << "iteration " << iteration << " element " << i;
        ASSERT_EQ(static_cast<int64_t>(got32[o]), want[o]);
      }
    }
  }
}

TEST(CudaIndexerTest, LargeViewsNeed64BitArithmetic) {
  const Vec shape = {1 << 20, 4096}, strides = {4096, 1};
  const Indexer<1> ix = make_indexer<1>(shape, {&strides});
  EXPECT_FALSE(ix.fits_32bit(int64_t{1} << 32));
  const Vec small = {8}, wide = {int64_t{1} << 29};  // 8 elements reaching past 2^31
  EXPECT_FALSE(make_indexer<1>(small, {&wide}).fits_32bit(8));
}

TEST(CudaIndexerTest, NegativeStridesAndTooManyDimsAreRefused) {
  const Vec shape = {3}, neg = {-1};
  EXPECT_THROW(make_indexer<1>(shape, {&neg}), InvalidArgument);
  Vec many_shape(20, 2), many_strides(20);
  for (int d = 0; d < 20; ++d) many_strides[d] = int64_t{3} << d;  // never mergeable
  EXPECT_THROW(make_indexer<1>(many_shape, {&many_strides}), InvalidArgument);
}

}  // namespace
}  // namespace tessel::cuda
