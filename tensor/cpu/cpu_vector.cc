// Contiguous f32 loops cloned per instruction set (see cpu_vector.h). Each case is a plain loop
// over fast_* functions that the compiler vectorises for the clone's vector width.
#include "tessel/tensor/cpu/cpu_vector.h"

#include <cmath>
#include <limits>

#include "tessel/tensor/cpu/cpu_isa.h"
#include "tessel/tensor/cpu/cpu_math.h"

namespace tessel::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kGeluCoeff = 0.044715f;

// The tanh form of gelu, 0.5 x (1 + tanh u) with u = sqrt(2 / pi) (x + 0.044715 x^3), computed
// as x sigmoid(2u) (the same function, without the cancellation of 1 + tanh u for x < 0);
// 2u = x (2 sqrt(2 / pi) + 2 sqrt(2 / pi) 0.044715 x^2).
[[gnu::always_inline]] inline float gelu_tanh_gate(float v) {
  return fast_sigmoid(v * (1.5957691216057308f + 0.071354816272681539f * (v * v)));
}
}  // namespace

// One loop per op; `v` is x[i].
#define TESSEL_UNARY_LOOP(expr)     \
  for (int64_t i = 0; i < n; ++i) { \
    const float v = x[i];           \
    out[i] = (expr);                \
  }                                 \
  return

TESSEL_ISA_CLONES void unary_f32(UnaryOp op, const float* x, float* out, int64_t n) {
  switch (op) {
    case UnaryOp::kNeg:
      TESSEL_UNARY_LOOP(-v);
    case UnaryOp::kExp:
      TESSEL_UNARY_LOOP(fast_exp(v));
    case UnaryOp::kLog:
      TESSEL_UNARY_LOOP(std::log(v));
    case UnaryOp::kSqrt:
      TESSEL_UNARY_LOOP(std::sqrt(v));
    case UnaryOp::kRsqrt:
      TESSEL_UNARY_LOOP(1.0f / std::sqrt(v));
    case UnaryOp::kTanh:
      TESSEL_UNARY_LOOP(fast_tanh(v));
    case UnaryOp::kRelu:
      TESSEL_UNARY_LOOP(v <= 0.0f ? 0.0f : v);  // NaN stays, -0 gives +0
    case UnaryOp::kSilu:
      TESSEL_UNARY_LOOP(v * fast_sigmoid(v));
    case UnaryOp::kGelu:
      TESSEL_UNARY_LOOP(v * fast_normal_cdf(v));
    case UnaryOp::kGeluTanh:
      TESSEL_UNARY_LOOP(v * gelu_tanh_gate(v));
    case UnaryOp::kAbs:
      TESSEL_UNARY_LOOP(std::fabs(v));
    case UnaryOp::kSigmoid:
      TESSEL_UNARY_LOOP(fast_sigmoid(v));
    case UnaryOp::kLogicalNot:
      TESSEL_UNARY_LOOP(v == 0.0f ? 1.0f : 0.0f);
  }
}
#undef TESSEL_UNARY_LOOP

// One loop per op; `p` is a[i] and `q` is b[i], or b[0] when b_step is 0 (two loops, so each
// vectorises).
#define TESSEL_BINARY_LOOP(expr)      \
  if (b_step == 0) {                  \
    const float q = b[0];             \
    for (int64_t i = 0; i < n; ++i) { \
      const float p = a[i];           \
      out[i] = (expr);                \
    }                                 \
  } else {                            \
    for (int64_t i = 0; i < n; ++i) { \
      const float p = a[i];           \
      const float q = b[i];           \
      out[i] = (expr);                \
    }                                 \
  }                                   \
  return

namespace {
// d/dv [v s(2u)] = s + 2 v s (1 - s) u' with s = sigmoid(2u). s (1 - s) is 0 once |v| > 10,
// so v^2 is capped in u' to keep it finite there (0 * inf would be NaN).
[[gnu::always_inline]] inline float gelu_tanh_grad(float g, float v) {
  const float s = gelu_tanh_gate(v);
  const float v2 = v * v > 1e4f ? 1e4f : v * v;
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v2);
  return g * (s + v * (s * (1.0f - s)) * (2.0f * du));
}
[[gnu::always_inline]] inline float silu_grad(float g, float v) {
  const float s = fast_sigmoid(v);
  return g * s * (1.0f + v * (1.0f - s));
}
}  // namespace

TESSEL_ISA_CLONES void binary_f32(BinaryOp op, const float* a, const float* b, int64_t b_step,
                                  float* out, int64_t n) {
  switch (op) {
    case BinaryOp::kAdd:
      TESSEL_BINARY_LOOP(p + q);
    case BinaryOp::kSub:
      TESSEL_BINARY_LOOP(p - q);
    case BinaryOp::kMul:
      TESSEL_BINARY_LOOP(p * q);
    case BinaryOp::kDiv:
      TESSEL_BINARY_LOOP(p / q);
    case BinaryOp::kPow:
      TESSEL_BINARY_LOOP(std::pow(p, q));
    case BinaryOp::kMaximum:
      TESSEL_BINARY_LOOP((p != p || p > q) ? p : q);
    case BinaryOp::kMinimum:
      TESSEL_BINARY_LOOP((p != p || p < q) ? p : q);
    case BinaryOp::kGeluBackward:
      TESSEL_BINARY_LOOP(p * (fast_normal_cdf(q) + q * kInvSqrt2Pi * fast_exp(-0.5f * q * q)));
    case BinaryOp::kGeluTanhBackward:
      TESSEL_BINARY_LOOP(gelu_tanh_grad(p, q));
    case BinaryOp::kSiluBackward:
      TESSEL_BINARY_LOOP(silu_grad(p, q));
    case BinaryOp::kReluBackward:
      TESSEL_BINARY_LOOP(q <= 0.0f ? 0.0f : p);  // as PyTorch: NaN passes
    default:
      return;  // comparisons: not handled here (binary_f32_supported is false)
  }
}
#undef TESSEL_BINARY_LOOP

TESSEL_ISA_CLONES void widen(const BFloat16* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
}
TESSEL_ISA_CLONES void widen(const Half* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
}
TESSEL_ISA_CLONES void narrow(const float* x, BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = BFloat16(x[i]);
}
TESSEL_ISA_CLONES void narrow(const float* x, Half* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Half(x[i]);
}

namespace {
constexpr int kLanes = 16;
// Sums term(i) over [0, n) in kLanes lanes, then the lanes and the tail in a fixed order.
template <typename F>
[[gnu::always_inline]] inline float lane_sum(int64_t n, F term) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += term(i + j);
  }
  float total = 0.0f;
  for (; i < n; ++i) total += term(i);
  for (int j = 0; j < kLanes; ++j) total += lanes[j];
  return total;
}
}  // namespace

TESSEL_ISA_CLONES float max_f32(const float* x, int64_t n) {
  float lanes[kLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  for (int j = 0; j < kLanes; ++j) mx = lanes[j] > mx ? lanes[j] : mx;
  return mx;
}

TESSEL_ISA_CLONES float sum_f32(const float* x, int64_t n) {
  return lane_sum(n, [x](int64_t i) { return x[i]; });
}

TESSEL_ISA_CLONES float dot_f32(const float* x, const float* y, int64_t n) {
  return lane_sum(n, [x, y](int64_t i) { return x[i] * y[i]; });
}

TESSEL_ISA_CLONES float sum_exp_f32(const float* x, float shift, int64_t n) {
  return lane_sum(n, [x, shift](int64_t i) { return fast_exp(x[i] - shift); });
}

bool binary_f32_supported(BinaryOp op) {
  switch (op) {
    case BinaryOp::kEq:
    case BinaryOp::kNe:
    case BinaryOp::kLt:
    case BinaryOp::kLe:
    case BinaryOp::kGt:
    case BinaryOp::kGe:
      return false;
    default:
      return true;
  }
}

}  // namespace tessel::cpu
