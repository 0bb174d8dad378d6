// The math reference itself: its gradients against central finite differences of its forward
// (in f64), with and without dropout, and the dropout mask's statistics.

#include "tessel/kernels/attention/attention_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention_test_util.h"
#include "tessel/kernels/attention/attention_dropout.h"

namespace tessel::kernels::attention {
namespace {

using testing::Buffer;
using testing::fill_normal;

// loss = sum(out * g); checks d loss / d x for every element of q, k and v.
void check_gradients(AttentionProblem p, Buffer& q, Buffer& k, Buffer& v, const Buffer& g) {
  const MathOptions f64{.f64_accumulate = true};
  auto loss = [&]() {
    Buffer out(DType::kF32, q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]);
    math_attention_forward(p, out.view(), nullptr, f64);
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += double(out.at(i)) * g.at(i);
    return s;
  };
  Buffer gcopy = g, dq = q, dk = k, dv = v;
  math_attention_backward(p, gcopy.view(), dq.view(), dk.view(), dv.view(), f64);
  const float eps = 1e-2f;
  for (auto [x, dx] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}}) {
    for (int64_t i = 0; i < x->numel(); ++i) {
      const float orig = x->at(i);
      x->set(i, orig + eps);
      const double up = loss();
      x->set(i, orig - eps);
      const double down = loss();
      x->set(i, orig);
      ASSERT_NEAR(dx->at(i), (up - down) / (2 * eps), 2e-3) << "element " << i;
    }
  }
}

TEST(MathAttentionTest, GradientsMatchFiniteDifferences) {
  for (bool dropout : {false, true}) {
    testing::Qkv in(DType::kF32, 1, 2, 1, 5, 6, 4, 1);
    fill_normal(in.q, 1, 0.5f);  // moderate scores keep the finite differences accurate
    fill_normal(in.k, 2, 0.5f);
    Buffer &q = in.q, &k = in.k, &v = in.v, &g = in.dout;
    AttentionProblem p = in.problem();
    p.mask.causal = true;
    p.mask.alignment = MaskAlignment::kBottomRight;
    if (dropout) p.dropout = {0.3, 99, 5};
    check_gradients(p, q, k, v, g);
  }
}

TEST(MathAttentionTest, UniformKeysAverageValues) {
  // With all-zero q every score is equal: the output is the mean of the visible values.
  Buffer q(DType::kF32, 1, 1, 3, 2), k(DType::kF32, 1, 1, 3, 2), v = k, out = q;
  fill_normal(k, 5);
  for (int64_t j = 0; j < 3; ++j) v.set(j * 2, float(j + 1)), v.set(j * 2 + 1, float(10 * (j + 1)));
  AttentionProblem p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  p.mask.causal = true;
  std::vector<float> lse(3);
  math_attention_forward(p, out.view(), lse.data());
  EXPECT_FLOAT_EQ(out.at(0), 1.0f);
  EXPECT_FLOAT_EQ(out.at(2), 1.5f);
  EXPECT_FLOAT_EQ(out.at(5), 20.0f);
  EXPECT_NEAR(lse[2], std::log(3.0f), 1e-6);
}

TEST(AttentionDropoutTest, KeepsOneMinusPAndIsReproducible) {
  const DropoutMask a(0.25, 1, 0), same(0.25, 1, 0), other_seed(0.25, 2, 0),
      other_offset(0.25, 1, 1);
  int64_t kept = 0, diff_seed = 0, diff_offset = 0;
  const int64_t n = 200000;
  std::vector<float> row(1000);
  for (int64_t e = 0; e < n; ++e) {
    const int64_t b = e % 3, h = (e / 3) % 5, i = e / 1000, j = e % 1000;
    const bool k = a.keep(b, h, i, j);
    kept += k;
    ASSERT_EQ(k, same.keep(b, h, i, j));
    diff_seed += k != other_seed.keep(b, h, i, j);
    diff_offset += k != other_offset.keep(b, h, i, j);
  }
  // Binomial(200000, 0.75): stddev ~194; allow 6 sigma.
  EXPECT_NEAR(double(kept), 0.75 * n, 1200);
  // Independent masks disagree on 2 * 0.25 * 0.75 = 37.5% of elements.
  EXPECT_NEAR(double(diff_seed) / n, 0.375, 0.01);
  EXPECT_NEAR(double(diff_offset) / n, 0.375, 0.01);
  // fill() agrees with keep() from an unaligned start.
  a.fill(1, 2, 3, 5, 999 - 5, row.data());
  for (int64_t j = 5; j < 999; ++j) {
    ASSERT_EQ(row[j - 5], a.keep(1, 2, 3, j) ? a.keep_scale() : 0.0f);
  }
}

}  // namespace
}  // namespace tessel::kernels::attention
