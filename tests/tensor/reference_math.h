#pragma once
// Double-precision references for the floating unary ops and their backward helpers, written
// from the definitions with std:: functions (shared by special_values_test and
// backend_conformance_test). At +-inf they follow IEEE arithmetic through the same formulas, so
// inf * 0 (silu and gelu at -inf) is NaN, as in PyTorch.

#include <cmath>
#include <numbers>

#include "tessel/tensor/backend.h"

namespace tessel::testing {

inline constexpr double kGeluTanhCoeff = 0.044715;
inline const double kSqrt2OverPi = std::sqrt(2.0 / std::numbers::pi);

inline double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// Phi(x), the standard normal CDF, without cancellation in the lower tail.
inline double ref_normal_cdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }
inline double ref_normal_pdf(double x) {
  return std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
}
// (1 + tanh u) / 2 = sigmoid(2u) with u = sqrt(2 / pi) (x + 0.044715 x^3).
inline double ref_gelu_tanh_gate(double x) {
  return ref_sigmoid(2.0 * kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x));
}

// op(x) for every floating UnaryOp (kLogicalNot gives 1 or 0). relu keeps NaN and maps -0 to +0.
inline double ref_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kExp:
      return std::exp(x);
    case UnaryOp::kLog:
      return std::log(x);
    case UnaryOp::kSqrt:
      return std::sqrt(x);
    case UnaryOp::kRsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryOp::kTanh:
      return std::tanh(x);
    case UnaryOp::kRelu:
      return x <= 0 ? 0.0 : x;
    case UnaryOp::kSilu:
      return x * ref_sigmoid(x);
    case UnaryOp::kGelu:
      return x * ref_normal_cdf(x);
    case UnaryOp::kGeluTanh:
      return x * ref_gelu_tanh_gate(x);
    case UnaryOp::kAbs:
      return std::fabs(x);
    case UnaryOp::kSigmoid:
      return ref_sigmoid(x);
    case UnaryOp::kLogicalNot:
      return x == 0 ? 1.0 : 0.0;
  }
  return std::nan("");
}

// The accuracy the CPU kernels keep, as special_values_test measures it: ulps from the f32
// rounding of the exact result. gelu's lower tails add the condition of exp at a rounded
// argument: exp(-x^2 / 2) costs up to x^2 / 2 ulp; the tanh form's exp(2u), with 2u rounded
// within 3 ulp, 3 |2u| ulp.
inline double unary_ulp_bound(UnaryOp op, double x) {
  const bool tail = std::isfinite(x) && x < 0;
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kAbs:
    case UnaryOp::kRelu:
    case UnaryOp::kSqrt:
    case UnaryOp::kLogicalNot:
      return 0;
    case UnaryOp::kRsqrt:
    case UnaryOp::kLog:
    case UnaryOp::kExp:
      return 1;
    case UnaryOp::kTanh:
      return 2;
    case UnaryOp::kSigmoid:
    case UnaryOp::kSilu:
      return 3;
    case UnaryOp::kGelu:
      return 8 + (tail ? x * x / 2 : 0);
    case UnaryOp::kGeluTanh:
      return 4 + (tail ? -6 * kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x) : 0);
  }
  return 0;
}

// Magnitudes below which a result may come out as 0: sigmoid is 1 / (1 + exp(-x)), which is 0
// once exp(-x) overflows (x < -88.72, where sigmoid < 3e-39), as in PyTorch; silu and the tanh
// form of gelu inherit it (|x sigmoid(x)| < 89 * 3e-39); gelu's erfc tail underflows near
// x = -14 (|gelu| < 1e-37).
inline double unary_flush_bound(UnaryOp op) {
  switch (op) {
    case UnaryOp::kSigmoid:
      return 3e-39;
    case UnaryOp::kSilu:
      return 2.7e-37;
    case UnaryOp::kGelu:
    case UnaryOp::kGeluTanh:
      return 1e-37;
    default:
      return 0;
  }
}

// The backward helpers (grad, x) -> grad * f'(x). relu's selects rather than multiplies
// (PyTorch's threshold_backward): x <= 0 gives 0 even for a NaN gradient, a NaN x passes it.
inline double ref_unary_backward(BinaryOp op, double g, double x) {
  switch (op) {
    case BinaryOp::kGeluBackward:
      return g * (ref_normal_cdf(x) + x * ref_normal_pdf(x));
    case BinaryOp::kGeluTanhBackward: {
      const double s = ref_gelu_tanh_gate(x);
      return g *
             (s + 2.0 * x * s * (1.0 - s) * kSqrt2OverPi * (1.0 + 3.0 * kGeluTanhCoeff * x * x));
    }
    case BinaryOp::kSiluBackward: {
      const double s = ref_sigmoid(x);
      return g * s * (1.0 + x * (1.0 - s));
    }
    case BinaryOp::kReluBackward:
      return x <= 0 ? 0.0 : g;
    default:
      return std::nan("");
  }
}

}  // namespace tessel::testing
