// kernels::grouped_matmul: forward and both gradients equal to a per-group loop of matmul bit for
// bit in f32 (empty groups included), and errors naming the bad shapes or offsets.

#include <gtest/gtest.h>

#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/moe/grouped_matmul.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels {
namespace {

void expect_bitwise_equal(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<float> va = to_vector<float>(contiguous(a));
  const std::vector<float> vb = to_vector<float>(contiguous(b));
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vb[i]) << "at " << i;
}

struct Case {
  std::vector<int64_t> counts;
  int64_t K, N;
};

class GroupedMatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(GroupedMatmulTest, MatchesPerGroupLoopBitForBit) {
  const Case c = GetParam();
  const int64_t G = static_cast<int64_t>(c.counts.size());
  std::vector<int64_t> offsets{0};
  for (int64_t n : c.counts) offsets.push_back(offsets.back() + n);
  const int64_t M = offsets.back();
  Generator gen(7);
  Tensor x = randn({M, c.K}, gen), w = randn({G, c.K, c.N}, gen), dy = randn({M, c.N}, gen);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y = grouped_matmul(x, w, offsets);
  backward(y, dy);

  Tensor x2 = detach(x), w2 = detach(w);
  x2.set_requires_grad(true);
  w2.set_requires_grad(true);
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < G; ++g) {
    if (c.counts[g] == 0) continue;
    parts.push_back(matmul(narrow(x2, 0, offsets[g], c.counts[g]), select(w2, 0, g)));
  }
  const Tensor y2 = parts.empty() ? zeros({M, c.N}) : cat(parts, 0);
  expect_bitwise_equal(y, y2);
  if (parts.empty()) return;
  backward(y2, dy);
  expect_bitwise_equal(x.grad(), x2.grad());
  // The loop leaves no gradient in an empty group's slice; the grouped op writes zeros there.
  expect_bitwise_equal(w.grad(), w2.grad());
}

INSTANTIATE_TEST_SUITE_P(Groups, GroupedMatmulTest,
                         ::testing::Values(Case{{1}, 3, 5}, Case{{4, 0, 7, 1}, 8, 6},
                                           Case{{0, 0, 3}, 5, 4}, Case{{70, 3, 129, 0, 17}, 24, 40},
                                           Case{{2, 2, 2, 2, 2, 2, 2, 2}, 16, 16}));

TEST(GroupedMatmulErrorsTest, NamesBadShapesAndOffsets) {
  const Tensor x = zeros({4, 3}), w = zeros({2, 3, 5});
  EXPECT_THROW(grouped_matmul(x, zeros({2, 4, 5}), {0, 2, 4}), InvalidArgument);
  EXPECT_THROW(grouped_matmul(x, w, {0, 4}), InvalidArgument);        // G + 1 offsets
  EXPECT_THROW(grouped_matmul(x, w, {0, 2, 3}), InvalidArgument);     // does not reach M
  EXPECT_THROW(grouped_matmul(x, w, {0, 3, 2, 4}), InvalidArgument);  // count
  EXPECT_THROW(grouped_matmul(x, w, {1, 2, 4}), InvalidArgument);
  try {
    grouped_matmul(x, zeros({3, 3, 5}), {0, 3, 2, 4});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("3 then 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::kernels
