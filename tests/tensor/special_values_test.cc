// IEEE / PyTorch semantics of the floating-point unary ops, their backward kernels, softmax,
// log_softmax and cross_entropy at special values (NaN, +-inf, +-0, denormals, the exp
// overflow/underflow thresholds, tiny arguments), and their accuracy over sweeps of random
// inputs, for f32 and bf16, against double-precision references built from std:: functions.
//
// The rules: NaN in gives NaN out; results at +-inf and +-0 (with their sign) are those of the
// double-precision formula; where that formula multiplies an infinity by a zero (silu and gelu
// at -inf, gelu backward at +-inf) the result is NaN, as in PyTorch. relu(NaN) is NaN,
// relu(-0) is +0, and relu's backward passes the gradient where x is NaN (PyTorch's
// threshold_backward). The accuracy sweep prints each op's worst error; run
//   build/release/tests/tensor/special_values_test --gtest_filter='*Sweep*'
// to see the figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "reference_math.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMax = std::numeric_limits<float>::max();
constexpr float kMinNormal = std::numeric_limits<float>::min();
constexpr float kMinDenormal = std::numeric_limits<float>::denorm_min();
using testing::ref_unary;
using testing::ref_unary_backward;
using testing::unary_flush_bound;
using testing::unary_ulp_bound;

// One floating unary op as users call it, and the UnaryOp whose reference and accuracy bounds
// (reference_math.h) it is checked against: a result passes when it is within
// unary_ulp_bound(op, x) ulp of the reference rounded to f32, or within unary_flush_bound(op)
// of it.
struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  UnaryOp kind;

  double ref(double x) const { return ref_unary(kind, x); }
  int64_t ulp_bound(double x) const { return static_cast<int64_t>(unary_ulp_bound(kind, x)); }
  double atol() const { return unary_flush_bound(kind); }
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& t) { return neg(t); }, UnaryOp::kNeg},
      {"abs", [](const Tensor& t) { return abs(t); }, UnaryOp::kAbs},
      {"relu", [](const Tensor& t) { return relu(t); }, UnaryOp::kRelu},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }, UnaryOp::kSqrt},
      {"rsqrt", [](const Tensor& t) { return rsqrt(t); }, UnaryOp::kRsqrt},
      {"log", [](const Tensor& t) { return log(t); }, UnaryOp::kLog},
      {"exp", [](const Tensor& t) { return exp(t); }, UnaryOp::kExp},
      {"tanh", [](const Tensor& t) { return tanh(t); }, UnaryOp::kTanh},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, UnaryOp::kSigmoid},
      {"silu", [](const Tensor& t) { return silu(t); }, UnaryOp::kSilu},
      {"gelu", [](const Tensor& t) { return gelu(t); }, UnaryOp::kGelu},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, GeluApproximation::kTanh); },
       UnaryOp::kGeluTanh},
      // NaN is not zero, so logical_not(NaN) is false (a bool result, compared as 0/1).
      {"logical_not", [](const Tensor& t) { return logical_not(t); }, UnaryOp::kLogicalNot},
  };
  return cases;
}

// ---- Comparing floats ---------------------------------------------------------------------------

// Floats as integers ordered like the values, adjacent floats 1 apart; +0 and -0 both 0.
int64_t ordered(float f) {
  const int32_t i = std::bit_cast<int32_t>(f);
  return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : i;
}
int64_t ulp_distance(float a, float b) { return std::llabs(ordered(a) - ordered(b)); }

// The same float: both NaN, or equal with the same sign (so -0 differs from +0).
bool same_float(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// A double rounded to f32 as IEEE arithmetic would (inf beyond FLT_MAX + half an ulp).
float round_to_float(double v) {
  if (std::fabs(v) >= static_cast<double>(kMax) + std::ldexp(1.0, 103))
    return std::copysign(kInf, static_cast<float>(v));
  return static_cast<float>(v);
}
float round_to_bf16(double v) { return static_cast<float>(BFloat16(round_to_float(v))); }

// Checks got against the reference value want (double) under the case's tolerance. Special
// results (NaN, infinities, zeros) must match exactly, signs included, unless atol allows a
// flush. Returns the ulp distance of a finite match beyond atol (0 within atol), or -1 after
// reporting a failure.
int64_t check_value(const char* op, float x, float got, double want, int64_t max_ulp, double atol) {
  const float want_f = round_to_float(want);
  const bool within_atol = std::isfinite(got) && std::fabs(got - want) <= atol;
  if (std::isnan(want_f) || std::isinf(want_f) || want_f == 0.0f) {
    if (same_float(got, want_f) || (atol > 0 && within_atol)) return 0;
    ADD_FAILURE() << op << "(" << x << ") = " << got << ", expected " << want_f;
    return -1;
  }
  if (!std::isfinite(got)) {
    ADD_FAILURE() << op << "(" << x << ") = " << got << ", expected " << want_f;
    return -1;
  }
  const int64_t ulps = ulp_distance(got, want_f);
  if (within_atol) return 0;
  if (ulps > max_ulp) {
    ADD_FAILURE() << op << "(" << x << ") = " << got << " is " << ulps << " ulp from the reference "
                  << want << " (at most " << max_ulp << " ulp or " << atol << " absolute)";
    return -1;
  }
  return ulps;
}

// A bf16 result (computed in f32, rounded once) against the reference: the reference rounded
// to bf16 exactly for special results, else within one bf16 ulp (2^16 f32 ulps), since the
// f32 result's own error can move the rounding by one.
void check_bf16(const char* op, float x, float got, double want, double atol) {
  const float want_bf16 = round_to_bf16(want);
  const bool special = std::isnan(want_bf16) || std::isinf(want_bf16) || want_bf16 == 0.0f;
  check_value(op, x, got, want_bf16, special ? 0 : 65536, atol);
}

Tensor f32_tensor(const std::vector<float>& v) { return from_vector<float>(v); }

// Inputs that sit on a rule or a threshold of some op.
std::vector<float> special_inputs() {
  std::vector<float> v = {
      kNaN, -kNaN, kInf, -kInf, 0.0f, -0.0f, kMinDenormal, -kMinDenormal, kMinNormal * 0.75f,
      -kMinNormal * 0.75f, kMinNormal, -kMinNormal, kMax, -kMax, 1e-30f, -1e-30f, 1e-7f, -1e-7f,
      1e-3f, -1e-3f, 0.5f, -0.5f, 1.0f, -1.0f, 2.0f, -2.0f,
      // exp: largest finite result just below 88.72284, inf just above; FLT_MIN at -87.33655;
      // the smallest denormal near -103.28; 0 below -103.97.
      88.0f, 88.72f, 88.7228f, 88.72283f, 88.72284f, 88.7229f, 89.0f, 100.0f, -87.0f, -87.33654f,
      -87.33655f, -87.5f, -88.72f, -90.0f, -100.0f, -103.0f, -103.27893f, -103.9f, -103.97208f,
      -104.0f, -110.0f, -1000.0f,
      // tanh switches formula at |x| = 0.625; sigmoid/tanh saturate near 9 and 17.
      0.625f, std::nextafter(0.625f, 0.0f), -0.625f, 9.0f, -9.0f, 17.0f, -17.0f, 20.0f, -20.0f,
      // gelu's lower tail.
      -3.0f, -5.0f, -8.0f, -10.0f, -13.0f, -14.0f, -15.0f, -20.0f, 1e20f, -1e20f};
  return v;
}

// ---- Special values -----------------------------------------------------------------------------

TEST(SpecialValuesTest, IssueExamples) {
  const auto one = [](const std::function<Tensor(const Tensor&)>& op, float x) {
    return to_vector<float>(op(f32_tensor({x})))[0];
  };
  const auto exp_op = [](const Tensor& t) { return exp(t); };
  EXPECT_TRUE(std::isnan(one(exp_op, kNaN)));
  EXPECT_EQ(one(exp_op, kInf), kInf);
  EXPECT_TRUE(same_float(one(exp_op, -kInf), 0.0f));
  const float big = one(exp_op, 88.72f);  // 3.39e38, within 1 ulp
  EXPECT_NEAR(big, 3.3932e38f, 1e34f);
  EXPECT_LE(ulp_distance(big, round_to_float(std::exp(static_cast<double>(88.72f)))), 1);
  EXPECT_EQ(one(exp_op, 88.73f), kInf);
  EXPECT_EQ(one(exp_op, -103.0f), static_cast<float>(std::exp(-103.0)));  // a denormal
  EXPECT_FLOAT_EQ(one([](const Tensor& t) { return tanh(t); }, 1e-7f), 1e-7f);
  EXPECT_TRUE(std::isnan(item(
      cross_entropy(reshape(f32_tensor({kNaN, 0, 0, 0}), {1, 4}), from_vector<int64_t>({1})))));
  EXPECT_TRUE(std::isnan(to_vector<float>(softmax(f32_tensor({1, kNaN, 2})))[0]));
}

TEST(SpecialValuesTest, UnaryOpsF32) {
  const std::vector<float> in = special_inputs();
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<float> out = to_vector<float>(c.op(f32_tensor(in)));
    for (size_t i = 0; i < in.size(); ++i)
      check_value(c.name, in[i], out[i], c.ref(in[i]), c.ulp_bound(in[i]), c.atol());
  }
}

// bf16 ops compute in f32 and round once: the result is within one bf16 rounding of the
// reference at the (exactly representable) bf16 input, and special values are exact.
TEST(SpecialValuesTest, UnaryOpsBF16) {
  std::vector<float> in;
  for (float f : special_inputs()) in.push_back(static_cast<float>(BFloat16(f)));
  in.push_back(std::bit_cast<float>(uint32_t{0x00010000}));  // the smallest bf16 denormal
  const Tensor x = to(f32_tensor(in), DType::kBF16);
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor y = c.op(x);
    ASSERT_EQ(y.dtype(), c.kind == UnaryOp::kLogicalNot ? DType::kBool : DType::kBF16);
    const std::vector<float> out = to_vector<float>(y);
    for (size_t i = 0; i < in.size(); ++i) {
      check_bf16(c.name, in[i], out[i], c.ref(in[i]), c.atol());
    }
  }
}

TEST(SpecialValuesTest, UnaryBackwardKernels) {
  const std::pair<const char*, BinaryOp> cases[] = {
      {"gelu_backward", BinaryOp::kGeluBackward},
      {"gelu_tanh_backward", BinaryOp::kGeluTanhBackward},
      {"silu_backward", BinaryOp::kSiluBackward},
      {"relu_backward", BinaryOp::kReluBackward}};
  // Finite x with grad 1 and 0.5, plus NaN x and NaN grad. (At x = +-inf the formulas give
  // inf * 0 = NaN for gelu and silu, as PyTorch's; checked against the same double formulas.)
  std::vector<float> xs = special_inputs(), gs;
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) gs.push_back(i % 2 == 0 ? 1.0f : 0.5f);
  xs.push_back(1.0f);
  gs.push_back(kNaN);
  xs.push_back(-1.0f);
  gs.push_back(kNaN);
  Backend& cpu = backend_for(Device::cpu());
  for (const auto& [name, op] : cases) {
    SCOPED_TRACE(name);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const Tensor g = to(f32_tensor(gs), dtype), x = to(f32_tensor(xs), dtype);
      Tensor out = empty({static_cast<int64_t>(xs.size())}, dtype);
      cpu.binary(op, g, x, out);
      const std::vector<float> got = to_vector<float>(out), xr = to_vector<float>(x);
      for (size_t i = 0; i < xs.size(); ++i) {
        const double want = ref_unary_backward(op, gs[i], xr[i]);
        if (dtype == DType::kF32) {
          // The derivative formulas lose relative accuracy where f' crosses 0 (near x = -0.75
          // for gelu, -1.28 for silu); 1e-6 absolute on top of 16 ulp covers it.
          check_value(name, xr[i], got[i], want, 16, 1e-6);
        } else {
          check_bf16(name, xr[i], got[i], want, 1e-6);
        }
      }
    }
  }
}

// ---- Softmax, log_softmax, cross_entropy --------------------------------------------------------

// Row-wise references in double: softmax and log-softmax of each row, NaN where the row holds
// a NaN or +inf or is all -inf (max - max is then NaN, as in PyTorch).
std::vector<double> ref_softmax_row(const std::vector<float>& row, bool log) {
  double mx = -std::numeric_limits<double>::infinity();
  bool nan = false;
  for (float v : row) {
    nan = nan || std::isnan(v);
    mx = std::max<double>(mx, v);
  }
  double sum = 0;
  for (float v : row) sum += std::exp(v - mx);
  std::vector<double> out;
  for (float v : row) {
    double y = log ? (v - mx) - std::log(sum) : std::exp(v - mx) / sum;
    if (nan) y = std::numeric_limits<double>::quiet_NaN();
    out.push_back(y);
  }
  return out;
}

// Rows that exercise the special cases; lengths 1 to 40 reach both the 16-lane loop and its tail.
std::vector<std::vector<float>> special_rows() {
  std::vector<std::vector<float>> rows = {
      {1.0f, kNaN, 2.0f},
      {kNaN},
      {-kInf, 0.0f, 1.0f, -kInf},           // masked entries: probability exactly 0
      {-kInf, -kInf, -kInf},                // fully masked: NaN
      {kInf, 0.0f},                         // NaN (inf - inf)
      {kMax, 0.0f, -kMax},                  // [1, 0, 0]
      {kMinDenormal, 0.0f, -kMinDenormal},  // equal thirds
      {100.0f, 0.0f, -100.0f, 12.0f},
      {0.0f},
  };
  std::vector<float> wide;  // 40 values over a wide range, with a NaN past the first 32
  for (int i = 0; i < 40; ++i) wide.push_back(static_cast<float>((i * 37) % 41 - 20) * 3.5f);
  rows.push_back(wide);
  wide[35] = kNaN;
  rows.push_back(wide);
  wide[35] = -kInf;
  rows.push_back(wide);
  return rows;
}

// Probabilities within 8 ulp; log-probabilities within 8 ulp or 4 ulp of the row's largest
// finite magnitude (log_softmax = x - logsumexp cancels near 0).
void check_softmax_row(const std::vector<float>& row, const std::vector<float>& got, bool log,
                       bool bf16) {
  const std::vector<double> want = ref_softmax_row(row, log);
  double largest = 1;
  for (float v : row) {
    if (std::isfinite(v)) largest = std::max<double>(largest, std::fabs(v));
  }
  const double log_atol = largest * std::ldexp(1.0, -21);
  for (size_t i = 0; i < row.size(); ++i) {
    const char* name = log ? "log_softmax" : "softmax";
    if (bf16) {
      check_bf16(name, row[i], got[i], want[i], 0);
    } else {
      check_value(name, row[i], got[i], want[i], 8, log ? log_atol : 0);
    }
  }
}

TEST(SpecialValuesTest, SoftmaxAndLogSoftmax) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (std::vector<float> row : special_rows()) {
      if (dtype == DType::kBF16) {
        for (float& v : row) v = static_cast<float>(BFloat16(v));
      }
      const Tensor x = to(f32_tensor(row), dtype);
      for (bool log : {false, true}) {
        SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") +
                     std::string(dtype_name(dtype)) + " row of " + std::to_string(row.size()));
        const std::vector<float> got = to_vector<float>(log ? log_softmax(x) : softmax(x));
        check_softmax_row(row, got, log, dtype == DType::kBF16);
      }
    }
  }
}

TEST(SpecialValuesTest, SoftmaxBackwardPropagatesNaN) {
  Backend& cpu = backend_for(Device::cpu());
  for (bool log : {false, true}) {
    const Tensor y =
        log ? log_softmax(f32_tensor({1, 2, 3, 4})) : softmax(f32_tensor({1, 2, 3, 4}));
    Tensor gx = empty({4});
    cpu.softmax_backward(f32_tensor({1, kNaN, 0, 0}), y, gx, log);
    for (float v : to_vector<float>(gx)) EXPECT_TRUE(std::isnan(v)) << "log " << log;
    // A masked entry (probability 0, log-probability -inf): softmax's gradient there is exactly
    // 0, log_softmax's is its own incoming gradient (d y_i / d x_i = 1 - p_i = 1).
    const Tensor ym =
        log ? log_softmax(f32_tensor({-kInf, 0, 1})) : softmax(f32_tensor({-kInf, 0, 1}));
    Tensor gm = empty({3});
    cpu.softmax_backward(f32_tensor({1, 2, 3}), ym, gm, log);
    EXPECT_EQ(to_vector<float>(gm)[0], log ? 1.0f : 0.0f) << "log " << log;
  }
}

TEST(SpecialValuesTest, CrossEntropyForwardAndBackward) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Rows: NaN logit; a -inf (masked) logit that is not the target; the target at -inf
    // (loss +inf); all -inf (NaN); an ignored row holding NaN (loss 0); an ordinary row.
    const std::vector<float> v = {kNaN,  0,     1,     2,     -kInf, 0, 1, 2, -kInf, 0, 1, 2,
                                  -kInf, -kInf, -kInf, -kInf, kNaN,  0, 1, 2, 3,     0, 1, 2};
    const Tensor logits = reshape(to(f32_tensor(v), dtype), {6, 4});
    const Tensor target = from_vector<int64_t>({1, 2, 0, 1, -100, 3});
    const std::vector<float> loss =
        to_vector<float>(cross_entropy(logits, target, -100, Reduction::kNone));
    const double lse = std::log(1 + std::exp(1.0) + std::exp(2.0));
    EXPECT_TRUE(std::isnan(loss[0]));
    EXPECT_NEAR(loss[1], lse - 1, 1e-6);
    EXPECT_EQ(loss[2], kInf);
    EXPECT_TRUE(std::isnan(loss[3]));
    EXPECT_TRUE(same_float(loss[4], 0.0f));
    EXPECT_NEAR(loss[5], std::log(std::exp(3.0) + 1 + std::exp(1.0) + std::exp(2.0)) - 2, 1e-6);
    EXPECT_TRUE(std::isnan(item(cross_entropy(logits, target))));  // the mean sees the NaN

    // Backward: NaN rows give NaN gradients, a masked logit gets exactly 0, ignored rows 0.
    const Tensor x = to(logits, DType::kF32).set_requires_grad(true);
    backward(sum(cross_entropy(x, target, -100, Reduction::kNone)));
    const std::vector<float> g = to_vector<float>(x.grad());
    for (int c = 0; c < 4; ++c) EXPECT_TRUE(std::isnan(g[c])) << c;
    EXPECT_TRUE(same_float(g[4], 0.0f));
    EXPECT_NEAR(g[6], std::exp(1 - lse) - 1, 1e-6);
    for (int c = 12; c < 16; ++c) EXPECT_TRUE(std::isnan(g[c])) << c;
    for (int c = 16; c < 20; ++c) EXPECT_TRUE(same_float(g[c], 0.0f)) << c;
  }
}

// ---- Accuracy sweeps ----------------------------------------------------------------------------

// About 1.6 million inputs: random bit patterns (every magnitude from denormals to FLT_MAX, both
// signs), uniform in [-20, 20] (the transition regions) and in [-110, 110] (exp's range), plus
// the smallest and largest magnitudes around the thresholds.
std::vector<float> sweep_inputs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> in;
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < (1 << 19); ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (!std::isnan(f)) in.push_back(f);
  }
  std::uniform_real_distribution<float> narrow(-20.0f, 20.0f), wide(-110.0f, 110.0f);
  for (int i = 0; i < (1 << 19); ++i) in.push_back(narrow(rng));
  for (int i = 0; i < (1 << 19); ++i) in.push_back(wide(rng));
  for (float base : {88.72283f, -87.33655f, -103.27893f, 0.625f, -0.625f}) {
    float f = base;
    for (int i = 0; i < 1000; ++i) f = std::nextafter(f, 0.0f);
    for (int i = 0; i < 2000; ++i, f = std::nextafter(f, kInf)) in.push_back(f);
  }
  return in;
}

// Every one of the 65536 bf16 values through every op.
TEST(SpecialValuesTest, AccuracyExhaustiveBF16) {
  std::vector<float> in;
  for (uint32_t b = 0; b < 65536; ++b) in.push_back(std::bit_cast<float>(b << 16));
  const Tensor x = to(f32_tensor(in), DType::kBF16);
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<float> out = to_vector<float>(c.op(x));
    for (size_t i = 0; i < in.size(); ++i) {
      if (::testing::Test::HasFailure()) return;  // one report is enough
      check_bf16(c.name, in[i], out[i], c.ref(in[i]), c.atol());
    }
  }
}

TEST(SpecialValuesTest, AccuracySweepF32) {
  constexpr uint64_t kSeed = 20240612;
  const std::vector<float> in = sweep_inputs(kSeed);
  const Tensor x = f32_tensor(in);
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(std::string(c.name) + " (sweep seed " + std::to_string(kSeed) + ")");
    const std::vector<float> out = to_vector<float>(c.op(x));
    int64_t worst = 0, worst_near = 0;  // over all inputs, over |x| <= 4
    float worst_x = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const int64_t u =
          check_value(c.name, in[i], out[i], c.ref(in[i]), c.ulp_bound(in[i]), c.atol());
      if (u < 0) break;  // one report per op is enough
      if (u > worst) {
        worst = u;
        worst_x = in[i];
      }
      if (std::fabs(in[i]) <= 4.0f) worst_near = std::max(worst_near, u);
    }
    std::printf("%-10s max %3lld ulp (at x = %.9g), %3lld ulp for |x| <= 4, over %zu inputs\n",
                c.name, static_cast<long long>(worst), worst_x, static_cast<long long>(worst_near),
                in.size());
  }
}

}  // namespace
}  // namespace tessel
