// Reductions: sum, mean, max, min, argmax, sum_to.
#include <algorithm>

#include "tessel/tensor/autograd.h"
#include "tessel/tensor/internal/op_util.h"
#include "tessel/tensor/ops.h"

namespace tessel {

using internal::backend_of;

namespace {

// Sorted unique wrapped dims; empty means all.
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t rank) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(internal::wrap_dim(d, rank));
  std::sort(out.begin(), out.end());
  TESSEL_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), InvalidArgument,
               "reduction dims {} repeat a dim", shape_str(dims));
  return out;
}

Shape kept_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out = shape;
  for (int64_t d : dims) out[d] = 1;
  return out;
}

Shape dropped_shape(const Shape& shape, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (!std::binary_search(dims.begin(), dims.end(), d)) out.push_back(shape[d]);
  }
  return out;
}

// Runs the kernel into a keepdim-shaped output, then drops the dims unless keepdim.
Tensor run_reduce(ReduceOp op, const Tensor& t, const std::vector<int64_t>& dims, bool keepdim,
                  DType out_dtype) {
  Tensor out = empty(kept_shape(t.shape(), dims), out_dtype, t.device());
  backend_of(t).reduce(op, t, dims, out);
  if (keepdim) return out;
  return out.as_strided(dropped_shape(t.shape(), dims),
                        contiguous_strides(dropped_shape(t.shape(), dims)), 0);
}

// g (reduced shape) back to the input's shape as a broadcast view.
Tensor expand_back(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims) {
  return expand(reshape(g, kept_shape(in_shape, dims)), in_shape);
}

Tensor extremum(ReduceOp op, const char* name, const Tensor& t, const std::vector<int64_t>& dims,
                bool keepdim) {
  TESSEL_CHECK(t.numel() > 0, InvalidArgument, "{} of an empty tensor of shape {}", name,
               shape_str(t.shape()));
  Tensor out = run_reduce(op, t, dims, keepdim, t.dtype());
  if (needs_grad({t})) {
    record_op(
        name, {t}, {out}, [x = detach(t), y = detach(out), dims](const std::vector<Tensor>& g) {
          // The gradient is shared evenly between the elements equal to the extremum.
          const Tensor hit = eq(x, expand_back(y, x.shape(), dims));
          const Tensor count = sum(to(hit, g[0].dtype()), dims, true);
          const Tensor share =
              expand_back(div(reshape(g[0], kept_shape(x.shape(), dims)), count), x.shape(), dims);
          return std::vector<Tensor>{
              where(hit, share, scalar_tensor(0.0, g[0].dtype(), g[0].device()))};
        });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  const std::vector<int64_t> d = normalize_dims(dims, t.dim());
  Tensor out =
      run_reduce(ReduceOp::kSum, t, d, keepdim, is_floating(t.dtype()) ? t.dtype() : DType::kI64);
  if (needs_grad({t})) {
    record_op("sum", {t}, {out}, [in_shape = t.shape(), d](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{expand_back(g[0], in_shape, d)};
    });
  }
  return out;
}

Tensor mean(const Tensor& t, const std::vector<int64_t>& dims, bool keepdim) {
  TESSEL_CHECK(is_floating(t.dtype()), InvalidArgument, "mean needs a floating tensor, got {}",
               dtype_name(t.dtype()));
  const std::vector<int64_t> d = normalize_dims(dims, t.dim());
  int64_t count = 1;
  for (int64_t k : d) count *= t.shape()[k];
  return div(sum(t, d, keepdim), static_cast<double>(count));
}

Tensor max(const Tensor& t) {
  return extremum(ReduceOp::kMax, "max", t, normalize_dims({}, t.dim()), false);
}
Tensor max(const Tensor& t, int64_t dim, bool keepdim) {
  return extremum(ReduceOp::kMax, "max", t, {internal::wrap_dim(dim, t.dim())}, keepdim);
}
Tensor min(const Tensor& t) {
  return extremum(ReduceOp::kMin, "min", t, normalize_dims({}, t.dim()), false);
}
Tensor min(const Tensor& t, int64_t dim, bool keepdim) {
  return extremum(ReduceOp::kMin, "min", t, {internal::wrap_dim(dim, t.dim())}, keepdim);
}

Tensor argmax(const Tensor& t, int64_t dim, bool keepdim) {
  const int64_t d = internal::wrap_dim(dim, t.dim());
  TESSEL_CHECK(t.shape()[d] > 0, InvalidArgument, "argmax over empty dim {} of shape {}", d,
               shape_str(t.shape()));
  Tensor out = empty(kept_shape(t.shape(), {d}), DType::kI64, t.device());
  backend_of(t).argmax(t, d, out);
  if (keepdim) return out;
  return reshape(out, dropped_shape(t.shape(), {d}));
}

Tensor sum_to(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  TESSEL_CHECK(broadcast_shapes(shape, t.shape()) == t.shape(), InvalidArgument,
               "sum_to: shape {} does not broadcast to {}", shape_str(shape), shape_str(t.shape()));
  const int64_t lead = t.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && t.shape()[d] != 1)) dims.push_back(d);
  }
  if (dims.empty()) return reshape(t, shape);
  return reshape(sum(t, dims, true), shape);
}

}  // namespace tessel
