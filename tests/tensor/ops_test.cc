// Forward values of ops against independent loops, views, dtypes (bf16/f16 vs f32), and errors.
#include "tessel/tensor/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel {
namespace {

std::vector<float> values(const Tensor& t) { return to_vector<float>(t); }

Tensor rnd(const Shape& shape, uint64_t seed, DType dtype = DType::kF32) {
  Generator gen(seed);
  return randn(shape, gen, dtype);
}

// Expects InvalidArgument/OutOfRange whose message contains every fragment.
template <typename E, typename F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const std::string& frag : fragments) {
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
    }
  }
}

TEST(OpsTest, CreationOnesFullArange) {
  EXPECT_EQ(values(ones({2, 2})), std::vector<float>({1, 1, 1, 1}));
  EXPECT_EQ(values(full({3}, 2.5)), std::vector<float>({2.5, 2.5, 2.5}));
  EXPECT_EQ(to_vector<int64_t>(arange(5)), std::vector<int64_t>({0, 1, 2, 3, 4}));
  EXPECT_EQ(values(arange(1.0, 2.0, 0.25, DType::kF32)), std::vector<float>({1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(item(scalar_tensor(3.0)), 3.0);
  EXPECT_EQ(item_int(full({1, 1}, 7, DType::kI64)), 7);
  EXPECT_THROW(item(ones({2})), InvalidArgument);
}

TEST(OpsTest, BroadcastAddMatchesLoop) {
  const Tensor a = rnd({4, 1, 3}, 1), b = rnd({5, 1}, 2);
  const Tensor c = add(a, b);
  ASSERT_EQ(c.shape(), Shape({4, 5, 3}));
  const auto va = values(a), vb = values(b), vc = values(c);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 3; ++k) EXPECT_EQ(vc[(i * 5 + j) * 3 + k], va[i * 3 + k] + vb[j]);
}

TEST(OpsTest, ElementwiseOnTransposedViewMatchesContiguous) {
  const Tensor a = rnd({64, 33}, 3);
  const Tensor t = transpose(a, 0, 1);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(values(exp(t)), values(exp(contiguous(t))));
  EXPECT_EQ(values(mul(t, t)), values(mul(contiguous(t), contiguous(t))));
}

TEST(OpsTest, DtypePromotion) {
  EXPECT_EQ(promote_types(DType::kBF16, DType::kF16), DType::kF32);
  EXPECT_EQ(promote_types(DType::kBF16, DType::kF32), DType::kF32);
  EXPECT_EQ(promote_types(DType::kI32, DType::kBF16), DType::kBF16);
  EXPECT_EQ(promote_types(DType::kI32, DType::kI64), DType::kI64);
  EXPECT_EQ(add(ones({2}, DType::kI32), ones({2}, DType::kBF16)).dtype(), DType::kBF16);
  EXPECT_EQ(mul(ones({2}, DType::kI64), 2.0).dtype(), DType::kI64);
  EXPECT_EQ(mul(ones({2}, DType::kI64), 0.5).dtype(), DType::kF32);
  EXPECT_EQ(div(full({2}, 3, DType::kI64), full({2}, 2, DType::kI64)).dtype(), DType::kF32);
  EXPECT_EQ(values(div(full({1}, 3, DType::kI64), full({1}, 2, DType::kI64)))[0], 1.5f);
  EXPECT_EQ(gt(ones({2}), 0.0).dtype(), DType::kBool);
  EXPECT_EQ(sum(ones({3}, DType::kI32)).dtype(), DType::kI64);
}

// bf16/f16 results equal the f32 op applied to the same (rounded) inputs, within the format's
// rounding of the result: 2^-8 relative for bf16, 2^-11 for f16 (plus a little absolute slack
// for reductions, which round once at the end).
TEST(OpsTest, HalfPrecisionMatchesF32WithinTolerance) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const double rel = dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
    const Tensor x = rnd({8, 32}, 5, dtype), y = rnd({32}, 6, dtype);
    const Tensor xf = to(x, DType::kF32), yf = to(y, DType::kF32);
    auto check = [&](const Tensor& low, const Tensor& ref, double slack) {
      EXPECT_EQ(low.dtype(), dtype);
      const auto a = values(low), b = values(ref);
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_NEAR(a[i], b[i], rel * std::fabs(b[i]) + slack) << dtype_name(dtype) << " " << i;
      }
    };
    check(add(x, y), add(xf, yf), 0);
    check(gelu(x), gelu(xf), 1e-6);
    check(softmax(x), softmax(xf), 1e-6);
    check(layer_norm(x, y, y), layer_norm(xf, yf, yf), 1e-5);
    check(sum(x, {1}), sum(xf, {1}), 1e-5);
    // matmul accumulates in f32; the inputs are already rounded, so only the output rounds
    // (K = 32 products, a few ulps of slack for the accumulation order).
    check(matmul(x, transpose(x, 0, 1)), matmul(xf, transpose(xf, 0, 1)), 1e-3);
  }
}

TEST(OpsTest, ViewsShareStorage) {
  const Tensor a = arange(0.0, 24.0, 1.0, DType::kF32);
  const Tensor v = view(a, {2, 3, 4});
  EXPECT_TRUE(v.storage().is_same(a.storage()));
  EXPECT_EQ(values(select(v, 1, 2)), std::vector<float>({8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(values(slice(v, 2, 1, -1, 2)), std::vector<float>({1, 5, 9, 13, 17, 21}));
  const Tensor p = permute(v, {2, 0, 1});
  EXPECT_EQ(p.shape(), Shape({4, 2, 3}));
  EXPECT_EQ(values(p)[1], 4.0f);
  EXPECT_THROW(view(p, {24}), InvalidArgument);  // needs a copy
  EXPECT_EQ(values(reshape(p, {24}))[1], 4.0f);
  EXPECT_EQ(values(expand(full({1}, 2.0), {2, 3})), std::vector<float>(6, 2.0f));
  const auto parts = chunk(arange(0.0, 7.0, 1.0, DType::kF32), 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(values(parts[2]), std::vector<float>({6}));
  EXPECT_EQ(values(cat({parts[2], parts[0]})), std::vector<float>({6, 0, 1, 2}));
}

// Element counts 0, 1, odd and large (many parallel chunks), on contiguous and strided inputs.
TEST(OpsTest, CountsSweep_ZeroOneOddLarge) {
  for (int64_t n : {0, 1, 7, 100003}) {
    const Tensor a = rnd({n}, 20), b = rnd({n}, 21);
    const auto va = values(a), vb = values(b);
    const auto c = values(add(a, b));
    const auto g = values(gelu(to(a, DType::kBF16)));
    ASSERT_EQ(c.size(), static_cast<size_t>(n));
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(c[i], va[i] + vb[i]);
      const float ar = float(BFloat16(va[i]));
      EXPECT_NEAR(g[i], 0.5 * ar * (1 + std::erf(ar / std::sqrt(2.0))), 1e-2 * (1 + std::fabs(ar)));
      total += va[i];
    }
    EXPECT_NEAR(item(sum(a)), total, 1e-3 * (1 + std::sqrt(static_cast<double>(n))));
    // Strided: every other element of a [n, 2] tensor.
    const Tensor wide = rnd({n, 2}, 22);
    const auto vw = values(wide), col = values(mul(select(wide, 1, 1), 2.0));
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(col[i], 2 * vw[i * 2 + 1]);
  }
  EXPECT_EQ(softmax(zeros({0, 5})).numel(), 0);
  EXPECT_EQ(layer_norm(zeros({0, 5}), Tensor(), Tensor()).numel(), 0);
  EXPECT_EQ(matmul(zeros({0, 3}), zeros({3, 4})).shape(), Shape({0, 4}));
  EXPECT_EQ(values(matmul(zeros({2, 0}), zeros({0, 2}))), std::vector<float>(4, 0.0f));
  EXPECT_EQ(item(sum(zeros({0}))), 0.0);
}

TEST(OpsTest, CopyFillAndConversion) {
  const Tensor a = zeros({2, 3});
  copy_(a, from_vector<float>({1, 2, 3}));
  EXPECT_EQ(values(a), std::vector<float>({1, 2, 3, 1, 2, 3}));
  fill_(narrow(a, 1, 1, 1), 9);
  EXPECT_EQ(values(a), std::vector<float>({1, 9, 3, 1, 9, 3}));
  EXPECT_EQ(to_vector<int64_t>(to(from_vector<float>({1.7f, -2.2f}), DType::kI64)),
            std::vector<int64_t>({1, -2}));
  const Tensor c = clone(a);
  EXPECT_FALSE(c.storage().is_same(a.storage()));
}

TEST(OpsTest, ReductionsMatchLoops) {
  const Tensor x = rnd({3, 4, 5}, 7);
  const auto v = values(x);
  const auto s = values(sum(x, {0, 2}));
  const auto m = values(max(x, 1));
  const auto am = to_vector<int64_t>(argmax(x, 1));
  for (int j = 0; j < 4; ++j) {
    double total = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) total += v[(i * 4 + j) * 5 + k];
    EXPECT_NEAR(s[j], total, 1e-5);
  }
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 5; ++k) {
      float best = -1e30f;
      int64_t arg = -1;
      for (int j = 0; j < 4; ++j) {
        if (v[(i * 4 + j) * 5 + k] > best) best = v[(i * 4 + j) * 5 + k], arg = j;
      }
      EXPECT_EQ(m[i * 5 + k], best);
      EXPECT_EQ(am[i * 5 + k], arg);
    }
  EXPECT_EQ(sum(x, {1}, true).shape(), Shape({3, 1, 5}));
  EXPECT_NEAR(item(mean(x)), std::accumulate(v.begin(), v.end(), 0.0) / 60.0, 1e-6);
}

TEST(OpsTest, SumIsIndependentOfThreadCount) {
  const Tensor x = rnd({3, 100003}, 8);
  const int before = num_threads();
  set_num_threads(1);
  const float one = item(sum(x));
  const auto rows_one = values(sum(x, {1}));
  set_num_threads(3);
  EXPECT_EQ(item(sum(x)), one);
  EXPECT_EQ(values(sum(x, {1})), rows_one);
  set_num_threads(before);
}

// layer_norm's input, weight and bias gradients (summed over blocks of rows) are bitwise the
// same for any thread count, in f32 and bf16, with a last block of rows that is not full.
TEST(OpsTest, LayerNormForwardAndBackwardAreIndependentOfThreadCount) {
  const int before = num_threads();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto run = [&](int threads) {
      set_num_threads(threads);
      const Tensor x = to(rnd({301, 40}, 20), dtype).set_requires_grad(true);
      const Tensor w = rnd({40}, 21).set_requires_grad(true);
      const Tensor b = rnd({40}, 22).set_requires_grad(true);
      const Tensor y = layer_norm(x, w, b);
      backward(sum(mul(to(y, DType::kF32), rnd({301, 40}, 23))));
      return std::vector<std::vector<float>>{values(y), values(x.grad()), values(w.grad()),
                                             values(b.grad())};
    };
    const auto one = run(1);
    EXPECT_EQ(run(2), one) << dtype_name(dtype);
    EXPECT_EQ(run(3), one) << dtype_name(dtype);
  }
  set_num_threads(before);
}

TEST(OpsTest, MatmulMatchesLoopsIncludingBroadcastAndTransposes) {
  const Tensor a = rnd({2, 3, 5}, 9), b = rnd({5, 4}, 10);
  const auto va = values(a), vb = values(b), vc = values(matmul(a, b));
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) {
        double acc = 0;
        for (int k = 0; k < 5; ++k) acc += va[(n * 3 + i) * 5 + k] * vb[k * 4 + j];
        EXPECT_NEAR(vc[(n * 3 + i) * 4 + j], acc, 1e-4);
      }
  const Tensor bt = contiguous(transpose(b, 0, 1));  // [4, 5]
  EXPECT_EQ(values(matmul(a, transpose(bt, 0, 1))), vc);
  EXPECT_EQ(linear(a, bt).shape(), Shape({2, 3, 4}));
  const auto lin = values(linear(a, bt));
  for (size_t i = 0; i < lin.size(); ++i) EXPECT_NEAR(lin[i], vc[i], 1e-5);
  // The bias is added in the GEMM (Backend::addmm): every row, also with split rows and no
  // reduction dim at all.
  const Tensor bias = rnd({4}, 11);
  const auto vbias = values(bias);
  const auto lb = values(linear(a, bt, bias));
  for (size_t i = 0; i < lb.size(); ++i) EXPECT_NEAR(lb[i], vc[i] + vbias[i % 4], 1e-5);
  const Tensor x = rnd({300, 5}, 12);
  EXPECT_LT(item(max(abs(sub(linear(x, bt, bias), add(matmul(x, b), bias))))), 1e-5);
  const auto empty_k = values(linear(zeros({3, 0}), zeros({4, 0}), bias));
  for (size_t i = 0; i < empty_k.size(); ++i) EXPECT_EQ(empty_k[i], vbias[i % 4]);
  EXPECT_EQ(linear(zeros({0, 5}), bt, bias).shape(), Shape({0, 4}));
}

// Shapes large enough that the CPU matmul splits rows or batches across threads.
TEST(OpsTest, MatmulSplitAcrossThreadsMatchesLoops) {
  const int before = num_threads();
  set_num_threads(3);
  for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{
           {{257, 33}, {33, 65}}, {{3, 97, 20}, {20, 7}}, {{1, 200, 16}, {4, 16, 9}}}) {
    const Tensor a = rnd(sa, 30), b = rnd(sb, 31);
    const Tensor c = matmul(a, b);
    const int64_t k = sa.back(), n = sb.back(), m = sa[sa.size() - 2];
    const int64_t batch = c.numel() / (m * n);
    Shape batch_a(c.shape().begin(), c.shape().end() - 2), batch_b = batch_a;
    batch_a.insert(batch_a.end(), {m, k});
    batch_b.insert(batch_b.end(), {k, n});
    const auto va = values(contiguous(expand(a, batch_a)));
    const auto vb = values(contiguous(expand(b, batch_b)));
    const auto vc = values(c);
    for (int64_t t = 0; t < batch; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t q = 0; q < k; ++q) acc += va[(t * m + i) * k + q] * vb[(t * k + q) * n + j];
          ASSERT_NEAR(vc[(t * m + i) * n + j], acc, 1e-4)
              << shape_str(sa) << " x " << shape_str(sb);
        }
  }
  set_num_threads(before);
}

TEST(OpsTest, SoftmaxLayerNormCrossEntropyMatchLoops) {
  const Tensor x = rnd({2, 5}, 11);
  const auto v = values(x), sm = values(softmax(x)), ln = values(layer_norm(x, Tensor(), Tensor()));
  const Tensor target = from_vector<int64_t>({3, -100});
  const double ce = item(cross_entropy(x, target));
  for (int r = 0; r < 2; ++r) {
    double mx = -1e30, z = 0, mean = 0, var = 0;
    for (int c = 0; c < 5; ++c) mx = std::max<double>(mx, v[r * 5 + c]);
    for (int c = 0; c < 5; ++c) z += std::exp(v[r * 5 + c] - mx);
    for (int c = 0; c < 5; ++c) EXPECT_NEAR(sm[r * 5 + c], std::exp(v[r * 5 + c] - mx) / z, 1e-6);
    for (int c = 0; c < 5; ++c) mean += v[r * 5 + c] / 5;
    for (int c = 0; c < 5; ++c) var += (v[r * 5 + c] - mean) * (v[r * 5 + c] - mean) / 5;
    for (int c = 0; c < 5; ++c) {
      EXPECT_NEAR(ln[r * 5 + c], (v[r * 5 + c] - mean) / std::sqrt(var + 1e-5), 1e-5);
    }
    if (r == 0) {
      EXPECT_NEAR(ce, mx + std::log(z) - v[3], 1e-5);  // row 1 is ignored
    }
  }
  EXPECT_TRUE(std::isnan(item(cross_entropy(x, full({2}, -100, DType::kI64)))));
}

TEST(OpsTest, GeluMatchesFormulas) {
  const Tensor x = from_vector<float>({-2.0f, -0.5f, 0.0f, 0.7f, 3.0f});
  const auto v = values(x), exact = values(gelu(x)),
             approx = values(gelu(x, GeluApproximation::kTanh));
  for (size_t i = 0; i < v.size(); ++i) {
    const double z = v[i];
    EXPECT_NEAR(exact[i], 0.5 * z * (1 + std::erf(z / std::sqrt(2.0))), 1e-6);
    EXPECT_NEAR(approx[i],
                0.5 * z * (1 + std::tanh(std::sqrt(2 / M_PI) * (z + 0.044715 * z * z * z))), 1e-6);
  }
}

TEST(OpsTest, DropoutKeepsExpectedFractionAndScales) {
  Generator gen(3);
  const Tensor y = dropout(ones({100000}), 0.25, true, &gen);
  const auto v = values(y);
  int64_t kept = 0;
  for (float f : v) {
    if (f != 0.0f) {
      ++kept;
      EXPECT_FLOAT_EQ(f, 1.0f / 0.75f);
    }
  }
  EXPECT_NEAR(kept / 100000.0, 0.75, 0.01);
  const Tensor same = ones({4});
  EXPECT_EQ(dropout(same, 0.5, false).impl_ptr(), same.impl_ptr());
}

TEST(OpsErrorTest, ShapeAndDtypeMismatchNameTheShapes) {
  expect_error<InvalidArgument>([] { add(ones({2, 3}), ones({4})); }, {"(2, 3)", "(4,)"});
  expect_error<InvalidArgument>([] { matmul(ones({2, 3}), ones({4, 5})); }, {"(2, 3)", "(4, 5)"});
  expect_error<InvalidArgument>(
      [] {
        matmul(ones({2, 3}), ones({3, 5}, DType::kBF16));
      },
      {"f32", "bf16"});
  expect_error<InvalidArgument>([] { linear(ones({2, 3}), ones({4, 5})); }, {"(2, 3)", "(4, 5)"});
  expect_error<InvalidArgument>([] { cat({ones({2, 3}), ones({2, 4})}, 0); }, {"(2, 4)", "(2, 3)"});
  expect_error<InvalidArgument>([] { where(ones({2}), ones({2}), ones({2})); }, {"bool", "f32"});
  expect_error<InvalidArgument>(
      [] {
        layer_norm(ones({2, 3}), ones({4}), Tensor());
      },
      {"(4,)", "3"});
  expect_error<InvalidArgument>(
      [] {
        cross_entropy(ones({2, 3}), zeros({3}, DType::kI64));
      },
      {"(2, 3)", "(3,)"});
  expect_error<InvalidArgument>([] { reshape(ones({2, 3}), {4, 2}); }, {"(2, 3)", "(4, 2)"});
  expect_error<OutOfRange>([] { transpose(ones({2, 3}), 0, 2); }, {"dimension 2"});
}

TEST(OpsErrorTest, OutOfRangeIndicesNameTheValue) {
  expect_error<OutOfRange>(
      [] {
        embedding(ones({4, 2}), from_vector<int64_t>({1, 4}));
      },
      {"index 4", "[0, 4)"});
  expect_error<OutOfRange>(
      [] {
        embedding(ones({4, 2}), from_vector<int32_t>({-1}));
      },
      {"index -1"});
  expect_error<OutOfRange>(
      [] {
        cross_entropy(ones({2, 3}), from_vector<int64_t>({0, 3}));
      },
      {"index 3", "[0, 3)"});
  expect_error<InvalidArgument>([] { embedding(ones({4, 2}), ones({2})); }, {"i64 or i32", "f32"});
}

}  // namespace
}  // namespace tessel
