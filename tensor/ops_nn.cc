// Neural-net ops: softmax, log_softmax, layer_norm, rms_norm, embedding, cross_entropy, dropout.
#include <algorithm>

#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/internal/op_util.h"
#include "tessel/tensor/ops.h"

namespace tessel {

using internal::backend_of;

namespace {

Tensor as_floating(const Tensor& t) { return is_floating(t.dtype()) ? t : to(t, DType::kF32); }

Tensor softmax_last(const Tensor& t, bool log) {
  NoGradGuard no_grad;
  const Tensor x = contiguous(as_floating(t));
  Tensor out = empty_like(x);
  backend_of(x).softmax(x, out, log);
  return out;
}

Tensor softmax_impl(const Tensor& t, int64_t dim, bool log) {
  if (t.dim() == 0) return softmax_impl(reshape(t, {1}), 0, log).as_strided({}, {}, 0);
  const int64_t d = internal::wrap_dim(dim, t.dim());
  if (d != t.dim() - 1) {
    return transpose(softmax_impl(transpose(t, d, -1), -1, log), d, -1);
  }
  Tensor out = softmax_last(t, log);
  if (needs_grad({t})) {
    record_op(log ? "log_softmax" : "softmax", {t}, {out},
              [y = detach(out), log](const std::vector<Tensor>& g) {
                const Tensor gc = contiguous(to(g[0], y.dtype()));
                Tensor gx = empty_like(y);
                backend_of(y).softmax_backward(gc, y, gx, log);
                return std::vector<Tensor>{gx};
              });
  }
  return out;
}

// Checks a per-feature parameter ([C], floating) and returns it in dtype (undefined stays so).
Tensor feature_param(const char* op, const char* what, const Tensor& p, int64_t features,
                     DType dtype) {
  if (!p.defined()) return p;
  TESSEL_CHECK(p.dim() == 1 && p.size(0) == features, InvalidArgument,
               "{}: {} has shape {} but the input's last dim is {}", op, what, shape_str(p.shape()),
               features);
  TESSEL_CHECK(is_floating(p.dtype()), InvalidArgument, "{}: {} must be floating, got {}", op, what,
               dtype_name(p.dtype()));
  return contiguous(to(p, dtype));
}

// Integer tensor -> contiguous i64 (the kernels check the values: see backend.h).
Tensor index_tensor(const char* op, const Tensor& idx) {
  TESSEL_CHECK(idx.dtype() == DType::kI64 || idx.dtype() == DType::kI32, InvalidArgument,
               "{}: indices must be i64 or i32, got {}", op, dtype_name(idx.dtype()));
  return contiguous(to(idx, DType::kI64));
}

}  // namespace

Tensor softmax(const Tensor& t, int64_t dim) {
  return softmax_impl(autocast_cast(t, AutocastCategory::kF32), dim, false);
}
Tensor log_softmax(const Tensor& t, int64_t dim) {
  return softmax_impl(autocast_cast(t, AutocastCategory::kF32), dim, true);
}

Tensor layer_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor x = autocast_cast(x_in, AutocastCategory::kF32);
  TESSEL_CHECK(x.dim() >= 1 && is_floating(x.dtype()), InvalidArgument,
               "layer_norm needs a floating tensor with at least 1 dim, got {}", x.str());
  const int64_t c = x.size(-1);
  Tensor xc, w, b, out, mean_t, rstd;
  {
    NoGradGuard no_grad;
    xc = contiguous(x);
    w = feature_param("layer_norm", "weight", weight, c, x.dtype());
    b = feature_param("layer_norm", "bias", bias, c, x.dtype());
    const int64_t rows = c == 0 ? 0 : x.numel() / c;
    out = empty_like(xc);
    mean_t = empty({rows}, DType::kF32, x.device());
    rstd = empty({rows}, DType::kF32, x.device());
    backend_of(x).layer_norm(xc, w, b, eps, out, mean_t, rstd);
  }
  if (needs_grad({x, weight, bias})) {
    record_op("layer_norm", {x, weight, bias}, {out},
              [xc = detach(xc), w = detach(w), mean_t, rstd,
               rw = weight.defined() && weight.requires_grad(),
               rb = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& g) {
                const Tensor gc = contiguous(g[0]);
                Tensor gx = empty_like(xc);
                Tensor gw = rw ? empty({xc.size(-1)}, DType::kF32, xc.device()) : Tensor();
                Tensor gb = rb ? empty({xc.size(-1)}, DType::kF32, xc.device()) : Tensor();
                backend_of(xc).layer_norm_backward(gc, xc, w, mean_t, rstd, gx, gw, gb);
                return std::vector<Tensor>{gx, gw, gb};
              });
  }
  return out;
}

Tensor rms_norm(const Tensor& x_in, const Tensor& weight, double eps) {
  const Tensor x = autocast_cast(x_in, AutocastCategory::kF32);
  TESSEL_CHECK(x.dim() >= 1 && is_floating(x.dtype()), InvalidArgument,
               "rms_norm needs a floating tensor with at least 1 dim, got {}", x.str());
  const int64_t c = x.size(-1);
  Tensor xc, w, out, rstd;
  {
    NoGradGuard no_grad;
    xc = contiguous(x);
    w = feature_param("rms_norm", "weight", weight, c, x.dtype());
    out = empty_like(xc);
    rstd = empty({c == 0 ? 0 : x.numel() / c}, DType::kF32, x.device());
    backend_of(x).rms_norm(xc, w, eps, out, rstd);
  }
  if (needs_grad({x, weight})) {
    record_op("rms_norm", {x, weight}, {out},
              [xc = detach(xc), w = detach(w), rstd,
               rw = weight.defined() && weight.requires_grad()](const std::vector<Tensor>& g) {
                const Tensor gc = contiguous(g[0]);
                Tensor gx = empty_like(xc);
                Tensor gw = rw ? empty({xc.size(-1)}, DType::kF32, xc.device()) : Tensor();
                backend_of(xc).rms_norm_backward(gc, xc, w, rstd, gx, gw);
                return std::vector<Tensor>{gx, gw};
              });
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  TESSEL_CHECK(weight.dim() == 2, InvalidArgument,
               "embedding: weight must be [num_embeddings, dim], got shape {}",
               shape_str(weight.shape()));
  internal::check_same_device("embedding", weight, indices);
  const Tensor idx = index_tensor("embedding", indices);
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  const Tensor w = contiguous(detach(weight));
  Tensor out = empty(shape, weight.dtype(), weight.device());
  backend_of(w).embedding(w, idx, out);
  if (needs_grad({weight})) {
    record_op("embedding", {weight}, {out},
              [idx, wshape = weight.shape()](const std::vector<Tensor>& g) {
                Tensor gw = zeros(wshape, DType::kF32, g[0].device());
                backend_of(gw).embedding_backward(contiguous(g[0]), idx, gw);
                return std::vector<Tensor>{gw};
              });
  }
  return out;
}

// An f32 op under autocast without a cast: its kernels widen 16-bit logits to f32 as they read
// them and the loss is f32, which is what casting the logits first would give, minus a pass.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     Reduction reduction) {
  TESSEL_CHECK(logits.dim() >= 1 && is_floating(logits.dtype()), InvalidArgument,
               "cross_entropy: logits must be floating with a class dim, got {}", logits.str());
  const int64_t classes = logits.size(-1);
  const int64_t rows = classes == 0 ? 0 : logits.numel() / classes;
  TESSEL_CHECK(target.numel() == rows && target.dim() == logits.dim() - 1, InvalidArgument,
               "cross_entropy: logits of shape {} need a target of shape {}, got {}",
               shape_str(logits.shape()),
               shape_str(Shape(logits.shape().begin(), logits.shape().end() - 1)),
               shape_str(target.shape()));
  const Tensor tgt = index_tensor("cross_entropy target", target);
  Tensor x, loss, lse;
  {
    NoGradGuard no_grad;
    x = contiguous(reshape(logits, {rows, classes}));
    loss = empty({rows}, DType::kF32, logits.device());
    lse = empty({rows}, DType::kF32, logits.device());
    backend_of(x).cross_entropy(x, tgt, ignore_index, loss, lse);
  }
  if (needs_grad({logits})) {
    record_op("cross_entropy", {logits}, {loss},
              [x = detach(x), tgt, lse, ignore_index,
               shape = logits.shape()](const std::vector<Tensor>& g) {
                Tensor gx = empty_like(x);
                backend_of(x).cross_entropy_backward(contiguous(g[0]), x, tgt, lse, ignore_index,
                                                     gx);
                return std::vector<Tensor>{reshape(gx, shape)};
              });
  }
  switch (reduction) {
    case Reduction::kNone:
      return reshape(loss, target.shape());
    case Reduction::kSum:
      return sum(loss);
    case Reduction::kMean:
      break;
  }
  // Divide by the rows not ignored, counted on the device (0 / 0 = NaN when all are ignored).
  Tensor counted;
  {
    NoGradGuard no_grad;
    counted = to(
        sum(ne(tgt, scalar_tensor(static_cast<double>(ignore_index), DType::kI64, tgt.device()))),
        DType::kF32);
  }
  return div(sum(loss), counted);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  TESSEL_CHECK(p >= 0.0 && p <= 1.0, InvalidArgument, "dropout probability {} is outside [0, 1]",
               p);
  if (!training || p == 0.0) return x;
  TESSEL_CHECK(is_floating(x.dtype()), InvalidArgument, "dropout needs a floating tensor, got {}",
               dtype_name(x.dtype()));
  Generator& g = gen ? *gen : default_generator();
  Tensor mask = empty(x.shape(), x.dtype(), x.device());
  const uint64_t offset = g.reserve(static_cast<uint64_t>(x.numel()));
  const double keep = 1.0 - p;
  backend_of(x).random(mask, RandomDistribution::kBernoulli, keep, keep > 0 ? 1.0 / keep : 0.0,
                       g.seed(), offset);
  return mul(x, mask);
}

}  // namespace tessel
