// Elementwise ops with broadcasting and dtype promotion, and their gradients.
#include <cmath>

#include "tessel/tensor/autograd.h"
#include "tessel/tensor/internal/op_util.h"
#include "tessel/tensor/ops.h"

namespace tessel {

using internal::backend_of;
using internal::broadcast_view;

namespace {

// Runs a binary kernel: inputs converted to `compute`, broadcast together, output `out_dtype`.
Tensor run_binary(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, DType compute,
                  DType out_dtype) {
  internal::check_same_device(name, a, b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape());
  NoGradGuard no_grad;
  const Tensor ac = to(a, compute), bc = to(b, compute);
  Tensor out = empty(shape, out_dtype, a.device());
  backend_of(a).binary(op, broadcast_view(ac, shape), broadcast_view(bc, shape), out);
  return out;
}

Tensor arith(const char* name, BinaryOp op, const Tensor& a, const Tensor& b,
             bool floating_only = false) {
  DType dtype = promote_types(a.dtype(), b.dtype());
  if (floating_only && !is_floating(dtype)) dtype = DType::kF32;
  return run_binary(name, op, a, b, dtype, dtype);
}

// The dtype a scalar takes next to tensor t (see the promotion rules in ops.h).
DType scalar_dtype(const Tensor& t, double v) {
  if (is_floating(t.dtype())) return t.dtype();
  if (std::trunc(v) != v) return DType::kF32;
  return t.dtype() == DType::kBool ? DType::kI64 : t.dtype();
}

Tensor scalar_like(const Tensor& t, double v) {
  return scalar_tensor(v, scalar_dtype(t, v), t.device());
}

Tensor run_unary(UnaryOp op, const Tensor& t, bool floating_only) {
  NoGradGuard no_grad;
  const Tensor x = floating_only && !is_floating(t.dtype()) ? to(t, DType::kF32) : t;
  Tensor out = empty(x.shape(), op == UnaryOp::kLogicalNot ? DType::kBool : x.dtype(), x.device());
  backend_of(x).unary(op, x, out);
  return out;
}

// What a unary op's backward needs: its input or its output (never both, so the other can be
// freed as soon as forward no longer needs it).
enum class Saves { kInput, kOutput };

// A float unary op whose gradient is grad_fn(g, saved), saved being the input or the output.
Tensor unary_op(const char* name, UnaryOp op, const Tensor& t, Saves saves,
                std::function<Tensor(const Tensor&, const Tensor&)> grad_fn) {
  Tensor out = run_unary(op, t, true);
  if (needs_grad({t})) {
    record_op(
        name, {t}, {out},
        [saved = detach(saves == Saves::kInput ? t : out), grad_fn = std::move(grad_fn)](
            const std::vector<Tensor>& g) { return std::vector<Tensor>{grad_fn(g[0], saved)}; });
  }
  return out;
}

// grad * f'(x) through a fused backward kernel.
Tensor backward_kernel(BinaryOp op, const Tensor& g, const Tensor& x) {
  return run_binary("backward", op, g, x, g.dtype(), g.dtype());
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = arith("add", BinaryOp::kAdd, a, b);
  if (needs_grad({a, b})) {
    record_op("add", {a, b}, {out}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to(g[0], sa), sum_to(g[0], sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = arith("sub", BinaryOp::kSub, a, b);
  if (needs_grad({a, b})) {
    const bool rb = b.requires_grad();
    record_op("sub", {a, b}, {out},
              [sa = a.shape(), sb = b.shape(), rb](const std::vector<Tensor>& g) {
                return std::vector<Tensor>{sum_to(g[0], sa), rb ? sum_to(neg(g[0]), sb) : Tensor()};
              });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = arith("mul", BinaryOp::kMul, a, b);
  if (needs_grad({a, b})) {
    // Each side's gradient needs the other side: keep only what a gradient will use.
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    record_op("mul", {a, b}, {out},
              [ra, rb, sa = a.shape(), sb = b.shape(), a = rb ? detach(a) : Tensor(),
               b = ra ? detach(b) : Tensor()](const std::vector<Tensor>& g) {
                return std::vector<Tensor>{ra ? sum_to(mul(g[0], b), sa) : Tensor(),
                                           rb ? sum_to(mul(g[0], a), sb) : Tensor()};
              });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = arith("div", BinaryOp::kDiv, a, b, true);
  if (needs_grad({a, b})) {
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    record_op("div", {a, b}, {out},
              [ra, rb, sa = a.shape(), b = detach(b),
               y = rb ? detach(out) : Tensor()](const std::vector<Tensor>& g) {
                return std::vector<Tensor>{
                    ra ? sum_to(div(g[0], b), sa) : Tensor(),
                    rb ? sum_to(neg(div(mul(g[0], y), b)), b.shape()) : Tensor()};
              });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = arith("pow", BinaryOp::kPow, a, b, true);
  if (needs_grad({a, b})) {
    record_op("pow", {a, b}, {out},
              [ra = a.requires_grad(), rb = b.requires_grad(), a = detach(a), b = detach(b),
               y = detach(out)](const std::vector<Tensor>& g) {
                return std::vector<Tensor>{
                    ra ? sum_to(mul(mul(g[0], b), pow(a, sub(b, 1.0))), a.shape()) : Tensor(),
                    rb ? sum_to(mul(mul(g[0], y), log(a)), b.shape()) : Tensor()};
              });
  }
  return out;
}

Tensor pow(const Tensor& a, double exponent) {
  Tensor out = arith("pow", BinaryOp::kPow, a, scalar_like(a, exponent), true);
  if (needs_grad({a})) {
    record_op("pow", {a}, {out}, [exponent, a = detach(a)](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(mul(g[0], pow(a, exponent - 1.0)), exponent)};
    });
  }
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = arith("maximum", BinaryOp::kMaximum, a, b);
  if (needs_grad({a, b})) {
    record_op("maximum", {a, b}, {out},
              [a = detach(a), b = detach(b)](const std::vector<Tensor>& g) {
                const Tensor take_a = ge(a, b);
                const Tensor zero = scalar_tensor(0.0, g[0].dtype(), g[0].device());
                return std::vector<Tensor>{sum_to(where(take_a, g[0], zero), a.shape()),
                                           sum_to(where(take_a, zero, g[0]), b.shape())};
              });
  }
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = arith("minimum", BinaryOp::kMinimum, a, b);
  if (needs_grad({a, b})) {
    record_op("minimum", {a, b}, {out},
              [a = detach(a), b = detach(b)](const std::vector<Tensor>& g) {
                const Tensor take_a = le(a, b);
                const Tensor zero = scalar_tensor(0.0, g[0].dtype(), g[0].device());
                return std::vector<Tensor>{sum_to(where(take_a, g[0], zero), a.shape()),
                                           sum_to(where(take_a, zero, g[0]), b.shape())};
              });
  }
  return out;
}

Tensor add(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor sub(double a, const Tensor& b) { return sub(scalar_like(b, a), b); }
Tensor mul(const Tensor& a, double b) { return mul(a, scalar_like(a, b)); }
Tensor div(const Tensor& a, double b) { return div(a, scalar_like(a, b)); }
Tensor div(double a, const Tensor& b) { return div(scalar_like(b, a), b); }

Tensor neg(const Tensor& t) {
  Tensor out = run_unary(UnaryOp::kNeg, t, false);
  if (needs_grad({t})) {
    record_op("neg", {t}, {out},
              [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  }
  return out;
}

Tensor exp(const Tensor& t) {
  return unary_op("exp", UnaryOp::kExp, t, Saves::kOutput,
                  [](const Tensor& g, const Tensor& y) { return mul(g, y); });
}
Tensor log(const Tensor& t) {
  return unary_op("log", UnaryOp::kLog, t, Saves::kInput,
                  [](const Tensor& g, const Tensor& x) { return div(g, x); });
}
Tensor sqrt(const Tensor& t) {
  return unary_op("sqrt", UnaryOp::kSqrt, t, Saves::kOutput,
                  [](const Tensor& g, const Tensor& y) { return div(mul(g, 0.5), y); });
}
Tensor rsqrt(const Tensor& t) {
  return unary_op(
      "rsqrt", UnaryOp::kRsqrt, t, Saves::kOutput,
      [](const Tensor& g, const Tensor& y) { return mul(mul(g, -0.5), mul(y, mul(y, y))); });
}
Tensor tanh(const Tensor& t) {
  return unary_op("tanh", UnaryOp::kTanh, t, Saves::kOutput,
                  [](const Tensor& g, const Tensor& y) { return mul(g, sub(1.0, mul(y, y))); });
}
Tensor sigmoid(const Tensor& t) {
  return unary_op("sigmoid", UnaryOp::kSigmoid, t, Saves::kOutput,
                  [](const Tensor& g, const Tensor& y) { return mul(g, mul(y, sub(1.0, y))); });
}
Tensor abs(const Tensor& t) {
  if (!is_floating(t.dtype())) return run_unary(UnaryOp::kAbs, t, false);
  return unary_op("abs", UnaryOp::kAbs, t, Saves::kInput, [](const Tensor& g, const Tensor& x) {
    return mul(g, sub(to(gt(x, 0.0), g.dtype()), to(lt(x, 0.0), g.dtype())));
  });
}
Tensor relu(const Tensor& t) {
  if (!is_floating(t.dtype())) return run_unary(UnaryOp::kRelu, t, false);
  return unary_op("relu", UnaryOp::kRelu, t, Saves::kInput, [](const Tensor& g, const Tensor& x) {
    return backward_kernel(BinaryOp::kReluBackward, g, x);
  });
}
Tensor silu(const Tensor& t) {
  return unary_op("silu", UnaryOp::kSilu, t, Saves::kInput, [](const Tensor& g, const Tensor& x) {
    return backward_kernel(BinaryOp::kSiluBackward, g, x);
  });
}
Tensor gelu(const Tensor& t, GeluApproximation approximation) {
  const bool exact = approximation == GeluApproximation::kNone;
  return unary_op("gelu", exact ? UnaryOp::kGelu : UnaryOp::kGeluTanh, t, Saves::kInput,
                  [exact](const Tensor& g, const Tensor& x) {
                    return backward_kernel(
                        exact ? BinaryOp::kGeluBackward : BinaryOp::kGeluTanhBackward, g, x);
                  });
}

namespace {
Tensor compare(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  return run_binary(name, op, a, b, promote_types(a.dtype(), b.dtype()), DType::kBool);
}
}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", BinaryOp::kEq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", BinaryOp::kNe, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", BinaryOp::kLt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", BinaryOp::kLe, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", BinaryOp::kGt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", BinaryOp::kGe, a, b); }
Tensor eq(const Tensor& a, double b) { return eq(a, scalar_like(a, b)); }
Tensor gt(const Tensor& a, double b) { return gt(a, scalar_like(a, b)); }
Tensor lt(const Tensor& a, double b) { return lt(a, scalar_like(a, b)); }
Tensor logical_not(const Tensor& t) { return run_unary(UnaryOp::kLogicalNot, t, false); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(cond.dtype() == DType::kBool, InvalidArgument,
               "where: condition must be bool, got {}", dtype_name(cond.dtype()));
  internal::check_same_device("where", cond, a);
  internal::check_same_device("where", a, b);
  const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape()));
  const DType dtype = promote_types(a.dtype(), b.dtype());
  Tensor out = empty(shape, dtype, a.device());
  {
    NoGradGuard no_grad;
    backend_of(a).where(broadcast_view(cond, shape), broadcast_view(to(a, dtype), shape),
                        broadcast_view(to(b, dtype), shape), out);
  }
  if (needs_grad({a, b})) {
    record_op("where", {a, b}, {out},
              [cond = detach(cond), ra = a.requires_grad(), rb = b.requires_grad(), sa = a.shape(),
               sb = b.shape()](const std::vector<Tensor>& g) {
                const Tensor zero = scalar_tensor(0.0, g[0].dtype(), g[0].device());
                return std::vector<Tensor>{ra ? sum_to(where(cond, g[0], zero), sa) : Tensor(),
                                           rb ? sum_to(where(cond, zero, g[0]), sb) : Tensor()};
              });
  }
  return out;
}

Tensor masked_fill(const Tensor& t, const Tensor& mask, double value) {
  TESSEL_CHECK(broadcast_shapes(mask.shape(), t.shape()) == t.shape(), InvalidArgument,
               "masked_fill: mask of shape {} does not broadcast to {}", shape_str(mask.shape()),
               shape_str(t.shape()));
  return where(mask, scalar_tensor(value, t.dtype(), t.device()), t);
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  internal::check_inplace("add_", dst);
  internal::check_same_device("add_", dst, src);
  TESSEL_CHECK(broadcast_shapes(dst.shape(), src.shape()) == dst.shape(), InvalidArgument,
               "add_: source of shape {} does not broadcast to {}", shape_str(src.shape()),
               shape_str(dst.shape()));
  NoGradGuard no_grad;
  Tensor s = to(src, dst.dtype());
  if (alpha != 1.0) s = mul(s, alpha);
  backend_of(dst).binary(BinaryOp::kAdd, dst, broadcast_view(to(s, dst.dtype()), dst.shape()), dst);
}

void mul_(const Tensor& dst, double value) {
  internal::check_inplace("mul_", dst);
  backend_of(dst).binary(
      BinaryOp::kMul, dst,
      broadcast_view(scalar_tensor(value, dst.dtype(), dst.device()), dst.shape()), dst);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& t) { return neg(t); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }

}  // namespace tessel
