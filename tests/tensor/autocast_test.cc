// AutocastGuard: the policy (scopes, nesting, device types, threads), which ops cast to what,
// numerics against double-precision references on the bf16-rounded inputs, and gradients that
// reach f32 leaves in f32.
#include "tessel/tensor/autocast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

// bf16 keeps 8 significant bits: one rounding (to nearest) moves a value by at most half a
// unit in the last place, 2^-8 of itself.
constexpr double kBf16Rounding = 1.0 / 256;

Tensor rnd(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  return mul(randn(shape, gen), scale);
}

// Values of t rounded to bf16 and back, as doubles.
std::vector<double> bf16_values(const Tensor& t) {
  const std::vector<float> v = to_vector<float>(to(to(t, DType::kBF16), DType::kF32));
  return {v.begin(), v.end()};
}

std::vector<double> values(const Tensor& t) {
  const std::vector<float> v = to_vector<float>(t);
  return {v.begin(), v.end()};
}

// sum_i a[i * a_step] * b[i * b_step] over n terms, in double, and the sum of the terms'
// magnitudes (what f32 accumulation error scales with: about n * 2^-24 of it at most).
struct Dot {
  double value = 0, magnitude = 0;
};
Dot dot(const double* a, int64_t a_step, const double* b, int64_t b_step, int64_t n) {
  Dot d;
  for (int64_t i = 0; i < n; ++i) {
    d.value += a[i * a_step] * b[i * b_step];
    d.magnitude += std::fabs(a[i * a_step] * b[i * b_step]);
  }
  return d;
}
constexpr double kF32Rounding = 6e-8;

TEST(AutocastTest, GuardScopesNestAndRestore) {
  EXPECT_FALSE(autocast_enabled());
  {
    AutocastGuard outer(DType::kBF16);
    EXPECT_TRUE(autocast_enabled(DeviceType::kCPU));
    EXPECT_TRUE(autocast_enabled(DeviceType::kCUDA));
    EXPECT_EQ(autocast_dtype(), DType::kBF16);
    {
      AutocastGuard inner(DType::kF16);
      EXPECT_EQ(autocast_dtype(), DType::kF16);
      {
        AutocastGuard off(DType::kBF16, /*enabled=*/false);
        EXPECT_FALSE(autocast_enabled());
        EXPECT_EQ(matmul(ones({2, 2}), ones({2, 2})).dtype(), DType::kF32);
      }
      EXPECT_TRUE(autocast_enabled());
      EXPECT_EQ(autocast_dtype(), DType::kF16);
    }
    EXPECT_EQ(autocast_dtype(), DType::kBF16);
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_FALSE(autocast_enabled(DeviceType::kCUDA));
}

TEST(AutocastTest, DeviceTypeGuardLeavesOtherDevicesAlone) {
  AutocastGuard cuda_only(DeviceType::kCUDA, DType::kBF16);
  EXPECT_TRUE(autocast_enabled(DeviceType::kCUDA));
  EXPECT_FALSE(autocast_enabled(DeviceType::kCPU));
  EXPECT_EQ(matmul(ones({2, 3}), ones({3, 2})).dtype(), DType::kF32);  // CPU tensors
  AutocastGuard cpu(DeviceType::kCPU, DType::kBF16);
  EXPECT_EQ(matmul(ones({2, 3}), ones({3, 2})).dtype(), DType::kBF16);
}

TEST(AutocastTest, RejectsADtypeThatIsNotLowerPrecision) {
  try {
    AutocastGuard bad(DType::kF32);
    FAIL() << "f32 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16 or f16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(AutocastGuard(DeviceType::kCPU, DType::kI64), InvalidArgument);
  EXPECT_FALSE(autocast_enabled());                   // a failed guard changed nothing
  AutocastGuard off(DType::kF32, /*enabled=*/false);  // any dtype when turning it off
  EXPECT_FALSE(autocast_enabled());
}

TEST(AutocastTest, PolicyIsPerThread) {
  AutocastGuard here(DType::kBF16);
  DType there_dtype = DType::kBF16;
  bool there_enabled = true;
  std::thread other([&] {
    there_enabled = autocast_enabled();
    there_dtype = matmul(ones({2, 2}), ones({2, 2})).dtype();
    AutocastGuard mine(DType::kF16);  // ends with the thread; never seen by this one
  });
  other.join();
  EXPECT_FALSE(there_enabled);
  EXPECT_EQ(there_dtype, DType::kF32);
  EXPECT_EQ(autocast_dtype(), DType::kBF16);
  EXPECT_EQ(matmul(ones({2, 2}), ones({2, 2})).dtype(), DType::kBF16);
}

TEST(AutocastTest, OpListsDecideTheComputeDtype) {
  const Tensor x = rnd({4, 8}, 1), w = rnd({6, 8}, 2), b = rnd({6}, 3);
  const Tensor xb = to(x, DType::kBF16);
  const Tensor target = from_vector<int64_t>({0, 5, 2, 1}, {4});
  AutocastGuard autocast(DType::kBF16);
  // Lower precision, whatever the inputs' dtypes.
  EXPECT_EQ(matmul(x, transpose(w, 0, 1)).dtype(), DType::kBF16);
  EXPECT_EQ(bmm(unsqueeze(x, 0), unsqueeze(transpose(w, 0, 1), 0)).dtype(), DType::kBF16);
  EXPECT_EQ(linear(x, w, b).dtype(), DType::kBF16);
  EXPECT_EQ(linear(x, w).dtype(), DType::kBF16);
  EXPECT_EQ(linear(to(x, DType::kF16), w, b).dtype(), DType::kBF16);
  // f32, whatever the inputs' dtypes.
  EXPECT_EQ(softmax(xb).dtype(), DType::kF32);
  EXPECT_EQ(log_softmax(xb, 0).dtype(), DType::kF32);
  EXPECT_EQ(layer_norm(xb, ones({8}), zeros({8})).dtype(), DType::kF32);
  EXPECT_EQ(rms_norm(xb, ones({8})).dtype(), DType::kF32);
  EXPECT_EQ(cross_entropy(to(linear(x, w, b), DType::kBF16), target).dtype(), DType::kF32);
  // Everything else keeps its inputs' dtypes and the usual promotion.
  EXPECT_EQ(gelu(xb).dtype(), DType::kBF16);
  EXPECT_EQ(add(x, xb).dtype(), DType::kF32);
  EXPECT_EQ(sum(xb).dtype(), DType::kBF16);
  // Integer inputs are never cast.
  EXPECT_EQ(embedding(w, target).dtype(), DType::kF32);
}

// A product under autocast equals the double-precision product of the bf16-rounded operands up
// to f32 accumulation and one rounding of the result to bf16.
TEST(AutocastTest, LinearAndMatmulRoundInputsOnceAndAccumulateInF32) {
  const int64_t M = 37, K = 300, N = 29;
  const Tensor x = rnd({M, K}, 4), w = rnd({N, K}, 5, 0.05), b = rnd({N}, 6);
  Tensor y, z;
  {
    AutocastGuard autocast(DType::kBF16);
    y = linear(x, w, b);
    z = matmul(x, transpose(w, 0, 1));
  }
  const std::vector<double> xr = bf16_values(x), wr = bf16_values(w), bv = values(b);
  const std::vector<double> got_y = values(y), got_z = values(z);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const auto [acc, mag] = dot(&xr[m * K], 1, &wr[n * K], 1, K);
      // f32 accumulation over K terms, then (for y) the bias, then one bf16 rounding.
      const double accumulation = K * kF32Rounding * mag;
      const double want_y = acc + bv[n];
      EXPECT_NEAR(got_y[m * N + n], want_y, kBf16Rounding * std::fabs(want_y) + accumulation)
          << m << "," << n;
      EXPECT_NEAR(got_z[m * N + n], acc, kBf16Rounding * std::fabs(acc) + accumulation)
          << m << "," << n;
    }
  }
}

// f32 leaves get f32 gradients: the weight's is g^T x from f32 accumulators, never rounded to
// bf16 (most of its values are not bf16 numbers), within f32 accumulation error of the
// double-precision product of the bf16 operands.
TEST(AutocastTest, GradientsOfF32LeavesComeBackF32FromF32Accumulators) {
  const int64_t M = 64, K = 48, N = 40;
  const Tensor x = rnd({M, K}, 7).set_requires_grad(true);
  const Tensor w = rnd({N, K}, 8, 0.1).set_requires_grad(true);
  const Tensor b = rnd({N}, 9).set_requires_grad(true);
  const Tensor g = rnd({M, N}, 10);
  Tensor y;
  {
    AutocastGuard autocast(DType::kBF16);
    y = linear(x, w, b);
  }
  ASSERT_EQ(y.dtype(), DType::kBF16);
  backward(y, to(g, DType::kBF16));
  for (const Tensor& leaf : {x, w, b}) {
    ASSERT_TRUE(leaf.grad().defined());
    EXPECT_EQ(leaf.grad().dtype(), DType::kF32);
    EXPECT_EQ(leaf.grad().shape(), leaf.shape());
    EXPECT_EQ(leaf.dtype(), DType::kF32);
  }
  const std::vector<double> xr = bf16_values(x), wr = bf16_values(w), gr = bf16_values(g);
  const std::vector<double> dw = values(w.grad()), dx = values(x.grad()), db = values(b.grad());
  int not_bf16 = 0;
  const std::vector<double> ones_m(M, 1.0);
  for (int64_t n = 0; n < N; ++n) {
    const Dot bias = dot(&gr[n], N, ones_m.data(), 1, M);
    EXPECT_NEAR(db[n], bias.value, M * kF32Rounding * bias.magnitude) << n;
    for (int64_t k = 0; k < K; ++k) {
      const auto [acc, mag] = dot(&gr[n], N, &xr[k], K, M);
      EXPECT_NEAR(dw[n * K + k], acc, M * kF32Rounding * mag) << n << "," << k;
      const float f = static_cast<float>(dw[n * K + k]);
      not_bf16 += static_cast<float>(BFloat16(f)) != f;
    }
  }
  EXPECT_GT(not_bf16, N * K * 9 / 10);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      const auto [acc, mag] = dot(&gr[m * N], 1, &wr[k], K, N);
      EXPECT_NEAR(dx[m * K + k], acc, N * kF32Rounding * mag) << m << "," << k;
    }
  }
}

// Backward runs with autocast off, so calling it inside a guard changes nothing; and the
// gradients of a two-layer network under autocast stay within bf16 error of f32's.
TEST(AutocastTest, BackwardIgnoresTheCallersPolicyAndStaysNearF32) {
  const Tensor x = rnd({16, 32}, 11);
  auto grads = [&](bool autocast, bool backward_inside) {
    const Tensor w1 = rnd({64, 32}, 12, 0.2).set_requires_grad(true);
    const Tensor w2 = rnd({8, 64}, 13, 0.2).set_requires_grad(true);
    std::optional<AutocastGuard> guard;
    if (autocast) guard.emplace(DType::kBF16);
    const Tensor h = gelu(linear(x, w1), GeluApproximation::kTanh);
    const Tensor loss =
        sum(mul(softmax(linear(layer_norm(h, Tensor(), Tensor()), w2)), rnd({16, 8}, 14)));
    if (!backward_inside) guard.reset();
    backward(loss);
    return std::pair{values(w1.grad()), values(w2.grad())};
  };
  const auto inside = grads(true, true), outside = grads(true, false), f32 = grads(false, false);
  EXPECT_EQ(inside, outside);
  for (const auto& [got, want] :
       {std::pair{&outside.first, &f32.first}, std::pair{&outside.second, &f32.second}}) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < want->size(); ++i) {
      err += ((*got)[i] - (*want)[i]) * ((*got)[i] - (*want)[i]);
      norm += (*want)[i] * (*want)[i];
    }
    // A few bf16 roundings along the path (inputs, activations, gradients), each at most 2^-8
    // and about a third of that on average; measured 0.55% for both weights.
    EXPECT_LT(std::sqrt(err / norm), 4 * kBf16Rounding);
    EXPECT_GT(std::sqrt(err / norm), 0.0);  // it did compute in bf16
  }
}

// Parameters already in bf16 (a parameter-dtype policy such as FSDP's) are used as they are:
// autocast only picks compute dtypes.
TEST(AutocastTest, Bf16ParametersAreNotCastAgain) {
  const Tensor w = to(rnd({6, 8}, 15), DType::kBF16).set_requires_grad(true);
  const Tensor x = rnd({4, 8}, 16);
  Tensor y;
  {
    AutocastGuard autocast(DType::kBF16);
    y = linear(x, w);
  }
  EXPECT_EQ(y.dtype(), DType::kBF16);
  backward(sum(to(y, DType::kF32)));
  EXPECT_EQ(w.grad().dtype(), DType::kBF16);
}

}  // namespace
}  // namespace tessel
