// Backend conformance (after ggml's test-backend-ops): every kernel of tensor/backend.h over
// random shapes (odd sizes, sizes past the vector loops, empty tensors, and now and then sizes
// past the parallel grains), random layouts (transposed, strided and broadcast stride-0 views
// where the kernel contract allows them) and every dtype the kernel takes.
//
// - The CPU backend is checked against double-precision references written here (the tensors
//   are read and written through raw memory: no kernel takes part in the reference), and for
//   writes outside its output views.
// - Every other device type with a registered backend and a device present (CUDA, once it
//   exists) runs the same problems and is checked against the references and the CPU backend.
//
// Tolerances (backend_conformance.h, expect_matches): exact for integer and bool results and
// for kernels that only move or select values (copy, fill, arange, where, embedding, argmax,
// max/min, bernoulli draws); otherwise a result may differ from the reference by the rounding of
// its dtype (2^-24 relative for f32, 2^-8 for bf16, 2^-11 for f16) plus eps times the error
// scale each reference derives from its computation (eps = 2^-24, the f32 unit roundoff).
//
// Seeds depend only on the case name and iteration and are printed with every failure, so a
// failure reproduces by rerunning the same test. Adding a kernel: append a KernelCase to
// all_cases() (make a Problem, run the kernel, compute the reference). The cases of the
// neural-net kernels, matmul and AdamW are in backend_conformance_nn.cc; those of Llama's fused
// RoPE and SwiGLU (kernels/llama/, fused on the CPU and CUDA) in backend_conformance_llama.cc;
// the MoE grouped matmul (kernels/moe/) in backend_conformance_moe.cc.
#include "backend_conformance.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "reference_math.h"
#include "tessel/base/error.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/random.h"
#include "tessel/tensor/stream.h"

namespace tessel::testing {
namespace {

// ---- copy, fill, arange, random -----------------------------------------------------------------

KernelCase copy_case() {
  return {"copy",
          [](Rng& rng, int it) {
            const DType from = pick(it, kAllDTypes), to_dtype = pick(it / 6, kAllDTypes);
            const Shape shape = random_shape(rng, 0, 4);
            // Floats in the integer range of every dtype; NaN and inf only into floats.
            ValueFn values = is_floating(from) ? normal_values(30) : values_for(from);
            if (is_floating(to_dtype)) values = with_specials(values);
            return Problem{{random_view(rng, shape, from, kAnyLayout, values)},
                           {random_view(rng, shape, to_dtype, kOutputLayout)}};
          },
          [](Backend& b, const Problem& p) { b.copy(p.in[0], p.out[0]); },
          [](const Problem& p) {
            Expected e;
            for (double v : read_all(p.in[0])) e.value.push_back(round_to(p.out[0].dtype(), v));
            return std::vector<Expected>{e};
          },
          0.0,
          36};  // every (source, destination) dtype pair
}

KernelCase copy_device_case() {
  return {"copy_device",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kAllDTypes);
            const Shape shape = random_shape(rng, 0, 3);
            return Problem{{contiguous_input(rng, shape, dtype, values_for(dtype))},
                           {output(rng, shape, dtype)}};
          },
          [](Backend& b, const Problem& p) { b.copy_device(p.in[0], p.out[0], false); },
          [](const Problem& p) {
            return std::vector<Expected>{{read_all(p.in[0]), {}}};
          }};
}

KernelCase fill_case() {
  return {"fill",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kAllDTypes);
            double value = is_floating(dtype) ? with_specials(normal_values(10))(rng)
                                              : static_cast<double>(uniform_int(rng, -1000, 1000));
            if (dtype == DType::kBool) value = static_cast<double>(uniform_int(rng, 0, 2)) * 0.75;
            return Problem{
                {}, {random_view(rng, random_shape(rng, 0, 4), dtype, kOutputLayout)}, {}, {value}};
          },
          [](Backend& b, const Problem& p) { b.fill(p.out[0], p.reals[0]); },
          [](const Problem& p) {
            const double v = round_to(p.out[0].dtype(), p.reals[0]);
            return std::vector<Expected>{{std::vector<double>(p.out[0].numel(), v), {}}};
          }};
}

KernelCase arange_case() {
  return {"arange",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kNumericDTypes);
            const int64_t n = random_shape(rng, 1, 1)[0];
            double start = static_cast<double>(uniform_int(rng, -50, 50));
            double step = static_cast<double>(uniform_int(rng, 1, 5)) * (coin(rng, 0.5) ? 1 : -1);
            if (is_floating(dtype)) {
              start = normal_values(10)(rng);
              step = uniform_values(-2, 2)(rng);
            }
            return Problem{{}, {output(rng, {n}, dtype)}, {}, {start, step}};
          },
          [](Backend& b, const Problem& p) { b.arange(p.out[0], p.reals[0], p.reals[1]); },
          [](const Problem& p) {
            Expected e;
            for (int64_t i = 0; i < p.out[0].numel(); ++i) {
              e.value.push_back(
                  round_to(p.out[0].dtype(), p.reals[0] + static_cast<double>(i) * p.reals[1]));
            }
            return std::vector<Expected>{e};
          }};
}

// random.h's stream, derived here from philox4x32 (whose known answers random_test checks):
// word 0's top 24 bits give a uniform in [0, 1); the normal is Box-Muller on words 0 and 1.
std::array<uint32_t, 4> philox_words(uint64_t seed, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

KernelCase random_case(RandomDistribution dist, const char* name) {
  return {name,
          [dist](Rng& rng, int it) {
            const DType dtype = pick(it, kFloatDTypes);
            // Parameters exact in f32 (the kernel computes in f32).
            double a = static_cast<float>(normal_values(2)(rng));
            double b = static_cast<float>(std::fabs(normal_values(2)(rng)) + 0.1);
            if (dist == RandomDistribution::kBernoulli) {
              a = static_cast<float>(uniform_values(0.05, 0.95)(rng));
              b = static_cast<float>(1.0 / a);
            }
            const uint64_t seed = rng(),
                           offset = coin(rng, 0.5) ? rng() >> 1 : uniform_int(rng, 0, 1000);
            return Problem{{},
                           {output(rng, random_shape(rng, 0, 3), dtype)},
                           {static_cast<int64_t>(seed), static_cast<int64_t>(offset)},
                           {a, b}};
          },
          [dist](Backend& b, const Problem& p) {
            b.random(p.out[0], dist, p.reals[0], p.reals[1], static_cast<uint64_t>(p.ints[0]),
                     static_cast<uint64_t>(p.ints[1]));
          },
          [dist](const Problem& p) {
            const uint64_t seed = static_cast<uint64_t>(p.ints[0]),
                           offset = static_cast<uint64_t>(p.ints[1]);
            const double a = p.reals[0], b = p.reals[1];
            Expected e;
            for (int64_t i = 0; i < p.out[0].numel(); ++i) {
              const auto w = philox_words(seed, offset + static_cast<uint64_t>(i));
              const double u = std::ldexp(static_cast<double>(w[0] >> 8), -24);
              double v = 0, scale = 0;
              switch (dist) {
                case RandomDistribution::kUniform:
                  v = a + (b - a) * u;
                  scale = 4 * (std::fabs(a) + std::fabs(b - a));
                  break;
                case RandomDistribution::kNormal: {
                  const double u1 = std::ldexp(static_cast<double>(w[0] >> 8) + 1, -24);
                  const double u2 = std::ldexp(static_cast<double>(w[1] >> 8), -24);
                  const double r = std::sqrt(-2 * std::log(u1));
                  v = a + b * r * std::cos(2 * std::numbers::pi * u2);
                  // f32 log, sqrt and cos, the last of an argument rounded to 2^-24 * 2 pi.
                  scale = 4 * std::fabs(a) + 16 * std::fabs(b) * (r + 1);
                  break;
                }
                case RandomDistribution::kBernoulli:
                  v = u < a ? b : 0.0;
                  break;
              }
              e.value.push_back(v);
              e.scale.push_back(scale);
            }
            return std::vector<Expected>{e};
          },
          dist == RandomDistribution::kBernoulli ? 0.0 : kEps};
}

// ---- unary, binary, where -----------------------------------------------------------------------

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
      return "neg";
    case UnaryOp::kExp:
      return "exp";
    case UnaryOp::kLog:
      return "log";
    case UnaryOp::kSqrt:
      return "sqrt";
    case UnaryOp::kRsqrt:
      return "rsqrt";
    case UnaryOp::kTanh:
      return "tanh";
    case UnaryOp::kRelu:
      return "relu";
    case UnaryOp::kSilu:
      return "silu";
    case UnaryOp::kGelu:
      return "gelu";
    case UnaryOp::kGeluTanh:
      return "gelu_tanh";
    case UnaryOp::kAbs:
      return "abs";
    case UnaryOp::kSigmoid:
      return "sigmoid";
    case UnaryOp::kLogicalNot:
      return "logical_not";
  }
  return "?";
}
const UnaryOp kUnaryOps[] = {
    UnaryOp::kNeg,  UnaryOp::kExp,     UnaryOp::kLog,       UnaryOp::kSqrt, UnaryOp::kRsqrt,
    UnaryOp::kTanh, UnaryOp::kRelu,    UnaryOp::kSilu,      UnaryOp::kGelu, UnaryOp::kGeluTanh,
    UnaryOp::kAbs,  UnaryOp::kSigmoid, UnaryOp::kLogicalNot};

KernelCase unary_case(UnaryOp op) {
  const bool integer_too = op == UnaryOp::kNeg || op == UnaryOp::kAbs || op == UnaryOp::kRelu ||
                           op == UnaryOp::kLogicalNot;
  return {std::string("unary_") + unary_name(op),
          [op, integer_too](Rng& rng, int it) {
            std::vector<DType> dtypes = kFloatDTypes;
            if (integer_too)
              dtypes = {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32};
            if (op == UnaryOp::kLogicalNot) dtypes = kAllDTypes;
            const DType dtype = pick(it, dtypes);
            const bool positive =
                op == UnaryOp::kLog || op == UnaryOp::kSqrt || op == UnaryOp::kRsqrt;
            ValueFn values = values_for(dtype, 3.0);
            if (is_floating(dtype)) {
              values = with_specials(positive ? [](Rng& r) {
                return coin(r, 0.1) ? -std::fabs(normal_values(1)(r)) : std::fabs(normal_values(3)(r));
              } : normal_values(3));
            }
            const Shape shape = random_shape(rng, 0, 4);
            const DType out = op == UnaryOp::kLogicalNot ? DType::kBool : dtype;
            return Problem{{random_view(rng, shape, dtype, kAnyLayout, values)},
                           {output(rng, shape, out)}};
          },
          [op](Backend& b, const Problem& p) { b.unary(op, p.in[0], p.out[0]); },
          [op](const Problem& p) {
            Expected e;
            for (double x : read_all(p.in[0])) {
              const double y = ref_unary(op, x);
              e.value.push_back(y);
              // The kernels' bound (at least 4 ulp), and their flush of tiny results to 0.
              e.scale.push_back(mag(y) * std::max(4.0, unary_ulp_bound(op, x)) +
                                unary_flush_bound(op) / kEps);
            }
            return std::vector<Expected>{e};
          },
          kEps};
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
    case BinaryOp::kPow:
      return "pow";
    case BinaryOp::kMaximum:
      return "maximum";
    case BinaryOp::kMinimum:
      return "minimum";
    case BinaryOp::kEq:
      return "eq";
    case BinaryOp::kNe:
      return "ne";
    case BinaryOp::kLt:
      return "lt";
    case BinaryOp::kLe:
      return "le";
    case BinaryOp::kGt:
      return "gt";
    case BinaryOp::kGe:
      return "ge";
    case BinaryOp::kGeluBackward:
      return "gelu_backward";
    case BinaryOp::kGeluTanhBackward:
      return "gelu_tanh_backward";
    case BinaryOp::kSiluBackward:
      return "silu_backward";
    case BinaryOp::kReluBackward:
      return "relu_backward";
  }
  return "?";
}
const BinaryOp kBinaryOps[] = {
    BinaryOp::kAdd,          BinaryOp::kSub,          BinaryOp::kMul,
    BinaryOp::kDiv,          BinaryOp::kPow,          BinaryOp::kMaximum,
    BinaryOp::kMinimum,      BinaryOp::kEq,           BinaryOp::kNe,
    BinaryOp::kLt,           BinaryOp::kLe,           BinaryOp::kGt,
    BinaryOp::kGe,           BinaryOp::kGeluBackward, BinaryOp::kGeluTanhBackward,
    BinaryOp::kSiluBackward, BinaryOp::kReluBackward};

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::kEq || op == BinaryOp::kNe || op == BinaryOp::kLt || op == BinaryOp::kLe ||
         op == BinaryOp::kGt || op == BinaryOp::kGe;
}
bool is_backward_helper(BinaryOp op) {
  return op == BinaryOp::kGeluBackward || op == BinaryOp::kGeluTanhBackward ||
         op == BinaryOp::kSiluBackward || op == BinaryOp::kReluBackward;
}

double ref_binary(BinaryOp op, double a, double b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
    case BinaryOp::kDiv:
      return a / b;
    case BinaryOp::kPow:
      return std::pow(a, b);
    case BinaryOp::kMaximum:
      return std::isnan(a) || std::isnan(b) ? nan : std::max(a, b);
    case BinaryOp::kMinimum:
      return std::isnan(a) || std::isnan(b) ? nan : std::min(a, b);
    case BinaryOp::kEq:
      return a == b;
    case BinaryOp::kNe:
      return a != b;
    case BinaryOp::kLt:
      return a < b;
    case BinaryOp::kLe:
      return a <= b;
    case BinaryOp::kGt:
      return a > b;
    case BinaryOp::kGe:
      return a >= b;
    default:
      return ref_unary_backward(op, a, b);
  }
}

KernelCase binary_case(BinaryOp op) {
  return {std::string("binary_") + binary_name(op),
          [op](Rng& rng, int it) {
            std::vector<DType> dtypes = kNumericDTypes;
            if (is_comparison(op)) dtypes = kAllDTypes;
            if (op == BinaryOp::kDiv || op == BinaryOp::kPow || is_backward_helper(op))
              dtypes = kFloatDTypes;
            const DType dtype = pick(it, dtypes);
            ValueFn values = values_for(dtype);
            if (is_floating(dtype))
              values = with_specials(normal_values(op == BinaryOp::kPow ? 1.5 : 3));
            // Comparisons of floats see ties (integers) often.
            if (is_floating(dtype) && is_comparison(op))
              values = with_specials(integer_values(-3, 3));
            const Shape shape = random_shape(rng, 0, 4);
            return Problem{{random_view(rng, shape, dtype, kAnyLayout, values),
                            random_view(rng, shape, dtype, kAnyLayout, values)},
                           {output(rng, shape, is_comparison(op) ? DType::kBool : dtype)}};
          },
          [op](Backend& b, const Problem& p) { b.binary(op, p.in[0], p.in[1], p.out[0]); },
          [op](const Problem& p) {
            Expected e;
            const std::vector<double> a = read_all(p.in[0]), b = read_all(p.in[1]);
            for (size_t i = 0; i < a.size(); ++i) {
              const double y = ref_binary(op, a[i], b[i]);
              e.value.push_back(y);
              // pow is libm's powf (1 ulp); the backward formulas sum terms of the size of the
              // gradient (g (1 + |x|)), which cancel where f' crosses 0.
              double scale = 4 * std::fabs(y);
              if (is_backward_helper(op)) scale = 16 * std::fabs(a[i]) * (1 + std::fabs(b[i]));
              e.scale.push_back(scale);
            }
            return std::vector<Expected>{e};
          },
          kEps};
}

KernelCase where_case() {
  return {"where",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kAllDTypes);
            const Shape shape = random_shape(rng, 0, 4);
            return Problem{{random_view(rng, shape, DType::kBool, kAnyLayout),
                            random_view(rng, shape, dtype, kAnyLayout),
                            random_view(rng, shape, dtype, kAnyLayout)},
                           {output(rng, shape, dtype)}};
          },
          [](Backend& b, const Problem& p) { b.where(p.in[0], p.in[1], p.in[2], p.out[0]); },
          [](const Problem& p) {
            Expected e;
            for (int64_t i = 0; i < p.out[0].numel(); ++i) {
              e.value.push_back(read(p.in[0], i) != 0 ? read(p.in[1], i) : read(p.in[2], i));
            }
            return std::vector<Expected>{e};
          }};
}

// ---- reductions ---------------------------------------------------------------------------------

// Output index of x's element `flat` when `dims` are reduced (kept as size 1).
int64_t reduced_index(int64_t flat, const Shape& shape, const std::vector<int64_t>& dims) {
  std::vector<int64_t> idx = unravel(flat, shape);
  int64_t out = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end();
    out = out * (reduced ? 1 : shape[d]) + (reduced ? 0 : idx[d]);
  }
  return out;
}

KernelCase reduce_case(ReduceOp op) {
  const bool exact = op == ReduceOp::kMax || op == ReduceOp::kMin;
  return {std::string("reduce_") + std::string(reduce_op_name(op)),
          [op, exact](Rng& rng, int it) {
            // Only sum and product are defined over no elements (0 and 1).
            const bool needs_elements = op != ReduceOp::kSum && op != ReduceOp::kProduct;
            const DType dtype = pick(it, op == ReduceOp::kAvg ? kFloatDTypes : kNumericDTypes);
            for (;;) {
              const Shape shape = random_shape(rng, 0, 4);
              std::vector<int64_t> dims;
              for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
                if (coin(rng, 0.5)) dims.push_back(d);
              }
              Shape kept = shape;
              int64_t count = 1;
              for (int64_t d : dims) {
                count *= shape[d];
                kept[d] = 1;
              }
              if (needs_elements && count == 0 && shape_numel(kept) > 0) continue;
              ValueFn values = values_for(dtype);
              if (op == ReduceOp::kProduct) {
                // Magnitudes near 1 so long products neither vanish at once nor overflow.
                values = is_floating(dtype) ? uniform_values(-1.5, 1.5) : integer_values(-1, 1);
              }
              if (is_floating(dtype)) values = with_specials(values);
              const DType out = !is_floating(dtype) && !exact ? DType::kI64 : dtype;
              return Problem{{random_view(rng, shape, dtype, kAnyLayout, values)},
                             {output(rng, kept, out)},
                             dims};
            }
          },
          [op](Backend& b, const Problem& p) { b.reduce(op, p.in[0], p.ints, p.out[0]); },
          [op](const Problem& p) {
            const Tensor& x = p.in[0];
            const int64_t outputs = p.out[0].numel();
            const int64_t count = outputs == 0 ? 0 : x.numel() / outputs;
            const double init = op == ReduceOp::kProduct ? 1
                                : op == ReduceOp::kMax   ? -std::numeric_limits<double>::infinity()
                                : op == ReduceOp::kMin   ? std::numeric_limits<double>::infinity()
                                                         : 0;
            Expected e{std::vector<double>(outputs, init), std::vector<double>(outputs, 0)};
            for (int64_t i = 0; i < x.numel(); ++i) {
              const double v = read(x, i);
              const int64_t o = reduced_index(i, x.shape(), p.ints);
              double& acc = e.value[o];
              switch (op) {
                case ReduceOp::kSum:
                case ReduceOp::kAvg:
                  acc += v;
                  break;
                case ReduceOp::kProduct:
                  acc *= v;
                  break;
                case ReduceOp::kMax:
                  acc = std::isnan(acc) || acc >= v ? acc : v;
                  break;
                case ReduceOp::kMin:
                  acc = std::isnan(acc) || acc <= v ? acc : v;
                  break;
              }
              e.scale[o] += std::fabs(v);
            }
            for (int64_t o = 0; o < outputs; ++o) {
              if (op == ReduceOp::kAvg) {
                e.value[o] /= static_cast<double>(count);
                e.scale[o] /= static_cast<double>(count);
              }
              // f32 accumulation: at most `count` roundings of partial sums (or products).
              e.scale[o] = (op == ReduceOp::kProduct ? std::fabs(e.value[o]) : e.scale[o]) *
                           (static_cast<double>(count) + 2);
            }
            return std::vector<Expected>{e};
          },
          exact ? 0.0 : kEps};
}

KernelCase argmax_case() {
  return {"argmax",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kAllDTypes);
            Shape shape = random_shape(rng, 1, 4);
            const int64_t dim = uniform_int(rng, 0, static_cast<int64_t>(shape.size()) - 1);
            if (shape[dim] == 0) shape[dim] = 3;  // the dim is not empty (contract)
            // Few distinct values, so ties are common (the first maximum wins), and NaN counts
            // as the largest.
            ValueFn values =
                is_floating(dtype) ? with_specials(integer_values(-4, 4)) : values_for(dtype);
            if (!is_floating(dtype) && dtype != DType::kBool) values = integer_values(-4, 4);
            Shape out = shape;
            out[dim] = 1;
            return Problem{{random_view(rng, shape, dtype, kAnyLayout, values)},
                           {output(rng, out, DType::kI64)},
                           {dim}};
          },
          [](Backend& b, const Problem& p) { b.argmax(p.in[0], p.ints[0], p.out[0]); },
          [](const Problem& p) {
            const Tensor& x = p.in[0];
            const int64_t dim = p.ints[0];
            Expected e{std::vector<double>(p.out[0].numel(), -1), {}};
            std::vector<double> best(p.out[0].numel());
            for (int64_t i = 0; i < x.numel(); ++i) {  // row-major: along dim in order
              const double v = read(x, i);
              const int64_t o = reduced_index(i, x.shape(), {dim});
              const int64_t k = unravel(i, x.shape())[dim];
              const bool better =
                  e.value[o] < 0 || (!std::isnan(best[o]) && (v > best[o] || std::isnan(v)));
              if (better) {
                e.value[o] = static_cast<double>(k);
                best[o] = v;
              }
            }
            return std::vector<Expected>{e};
          }};
}

// ---- The table and the tests --------------------------------------------------------------------

const std::vector<KernelCase>& all_cases() {
  static const std::vector<KernelCase> cases = [] {
    std::vector<KernelCase> c = {copy_case(),
                                 copy_device_case(),
                                 fill_case(),
                                 arange_case(),
                                 random_case(RandomDistribution::kUniform, "random_uniform"),
                                 random_case(RandomDistribution::kNormal, "random_normal"),
                                 random_case(RandomDistribution::kBernoulli, "random_bernoulli")};
    for (UnaryOp op : kUnaryOps) c.push_back(unary_case(op));
    for (BinaryOp op : kBinaryOps) c.push_back(binary_case(op));
    c.push_back(where_case());
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
      c.push_back(reduce_case(op));
    }
    c.insert(c.end(), {argmax_case(),
                       softmax_case(false),
                       softmax_case(true),
                       softmax_backward_case(false),
                       softmax_backward_case(true),
                       norm_case(false),
                       norm_backward_case(false),
                       norm_case(true),
                       norm_backward_case(true),
                       embedding_case(),
                       embedding_backward_case(),
                       cross_entropy_case(),
                       cross_entropy_backward_case(),
                       matmul_case(),
                       addmm_case(),
                       adamw_case(),
                       rope_case(false),
                       rope_case(true),
                       swiglu_case(false),
                       swiglu_case(true),
                       grouped_matmul_case(false),
                       grouped_matmul_case(true)});
    return c;
  }();
  return cases;
}

// Device types other than the CPU whose backend is registered and which have a device now.
// The meta device is left out: its tensors have no values to compare.
std::vector<Device> other_devices(std::string* skipped) {
  std::vector<Device> devices;
  for (int t = 0; t < kDeviceTypeCount; ++t) {
    const DeviceType type = static_cast<DeviceType>(t);
    const std::string name(device_type_name(type));
    if (type == DeviceType::kCPU) continue;
    if (type == DeviceType::kMeta) {
      *skipped += "meta (no values); ";
      continue;
    }
    const Device device{type, 0};
    try {
      backend_for(device);
    } catch (const Unavailable&) {
      *skipped += name + " (no backend in this build); ";
      continue;
    }
    if (device_count(type) == 0) {
      *skipped += name + " (no device present); ";
      continue;
    }
    devices.push_back(device);
  }
  return devices;
}

class BackendConformanceTest : public ::testing::TestWithParam<size_t> {};

TEST_P(BackendConformanceTest, CpuMatchesReference) { check_cpu_backend(all_cases()[GetParam()]); }

INSTANTIATE_TEST_SUITE_P(Kernels, BackendConformanceTest,
                         ::testing::Range<size_t>(0, all_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return all_cases()[info.param].name;
                         });

TEST(BackendConformanceDevicesTest, EveryDeviceBackendMatchesCpu) {
  std::string skipped;
  const std::vector<Device> devices = other_devices(&skipped);
  if (devices.empty())
    GTEST_SKIP() << "no device backend besides the CPU to check; skipped " << skipped;
  for (const Device& device : devices) {
    std::printf("checking the %s backend against the CPU backend\n", device.str().c_str());
    for (const KernelCase& c : all_cases()) check_device_backend(c, device);
  }
}

// Three iterations of every case on each device: what scripts/gpu-check.sh runs under
// compute-sanitizer, where the full pass takes too long.
TEST(BackendConformanceDevicesTest, EveryDeviceBackendBriefly) {
  std::string skipped;
  const std::vector<Device> devices = other_devices(&skipped);
  if (devices.empty())
    GTEST_SKIP() << "no device backend besides the CPU to check; skipped " << skipped;
  for (const Device& device : devices) {
    for (KernelCase c : all_cases()) {
      c.iterations = 3;
      check_device_backend(c, device);
    }
  }
}

// The device path of the harness (moving problems to a device and results back, comparing with
// the reference and the CPU), run with the CPU standing in for the device so that it is
// exercised where no other device exists. A few iterations of every case.
TEST(BackendConformanceDevicesTest, DevicePathWithTheCpuStandingIn) {
  for (KernelCase c : all_cases()) {
    c.iterations = 3;
    check_device_backend(c, Device::cpu());
  }
}

// The harness itself must be able to fail: a result one ulp off an exact kernel, or past the
// tolerance of an inexact one, is reported.
TEST(BackendConformanceHarnessTest, ReportsMismatches) {
  Rng rng(1);
  const Tensor t = output(rng, {3}, DType::kF32);
  for (int64_t i = 0; i < 3; ++i) write(t, i, 1.0);
  EXPECT_NONFATAL_FAILURE(
      expect_matches(t, {1.0, 1.0, std::nextafter(1.0f, 2.0f)}, {}, 0, 1, "exact"),
      "exact: element 2");
  EXPECT_NONFATAL_FAILURE(expect_matches(t, {1.0, 1.0, 1.0 + 1e-5}, {}, kEps, 1, "inexact"),
                          "inexact: element 2");
  EXPECT_TRUE(expect_matches(t, {1.0, 1.0, 1.0 + 1e-8}, {}, kEps, 1, "within"));
  const std::vector<char> before = storage_bytes(t);
  write(t.as_strided({1}, {1}, t.offset() + 3), 0, 5.0);  // the guard after the view
  EXPECT_NONFATAL_FAILURE(check_untouched(t, before, "guard"), "outside the view was written");
}

}  // namespace
}  // namespace tessel::testing
