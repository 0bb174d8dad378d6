// Views (share storage, differentiable) and concatenation.
#include <algorithm>
#include <numeric>
#include <optional>

#include "tessel/tensor/autograd.h"
#include "tessel/tensor/internal/op_util.h"
#include "tessel/tensor/ops.h"

namespace tessel {

using internal::wrap_dim;

namespace {

// Resolves one -1 in `shape` against numel; throws naming both shapes when they disagree.
Shape infer_shape(const Shape& shape, int64_t numel, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TESSEL_CHECK(infer < 0, InvalidArgument, "shape {} has more than one -1", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      TESSEL_CHECK(out[i] >= 0, InvalidArgument, "negative size in shape {}", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    TESSEL_CHECK(known != 0 && numel % known == 0, InvalidArgument,
                 "cannot view shape {} ({} elements) as {}", shape_str(from), numel,
                 shape_str(shape));
    out[infer] = numel / known;
  }
  TESSEL_CHECK(shape_numel(out) == numel, InvalidArgument,
               "cannot view shape {} ({} elements) as {} ({} elements)", shape_str(from), numel,
               shape_str(out), shape_numel(out));
  return out;
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), if any exist.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides,
                                    const Shape& shape) {
  if (old_shape.empty() || shape_numel(shape) == 0) return contiguous_strides(shape);
  Strides strides(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

// Records a view op whose gradient is make_backward()(g). The backward closure is built only
// when a graph is recorded: views are taken on every collective and redistribution, where
// copying shapes into a closure nobody calls was most of a view's cost.
template <class MakeBackward>
Tensor record_view(const char* name, const Tensor& in, Tensor out, MakeBackward&& make_backward) {
  if (needs_grad(in)) {
    record_op(name, {in}, {out}, [backward = make_backward()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{backward(g[0])};
    });
  }
  return out;
}

// The gradient of a view into `shape`: zeros with g copied into the same view.
Tensor scatter_into_zeros(const Shape& shape, DType dtype, Device device, const Tensor& g,
                          const std::function<Tensor(const Tensor&)>& make_view) {
  Tensor z = zeros(shape, dtype, device);
  copy_(make_view(z), g);
  return z;
}

}  // namespace

Tensor view(const Tensor& t, const Shape& shape) {
  const Shape target = infer_shape(shape, t.numel(), t.shape());
  auto strides = view_strides(t.shape(), t.strides(), target);
  TESSEL_CHECK(strides.has_value(), InvalidArgument,
               "view: tensor of shape {} with strides {} cannot be viewed as {} without a copy; "
               "use reshape",
               shape_str(t.shape()), shape_str(t.strides()), shape_str(target));
  return record_view("view", t, t.as_strided(target, *strides, t.offset()), [&] {
    return [in_shape = t.shape()](const Tensor& g) { return reshape(g, in_shape); };
  });
}

Tensor reshape(const Tensor& t, const Shape& shape) {
  const Shape target = infer_shape(shape, t.numel(), t.shape());
  if (view_strides(t.shape(), t.strides(), target)) return view(t, target);
  return view(clone(t), target);
}

Tensor flatten(const Tensor& t, int64_t start_dim, int64_t end_dim) {
  if (t.dim() == 0) return reshape(t, {1});
  start_dim = wrap_dim(start_dim, t.dim());
  end_dim = wrap_dim(end_dim, t.dim());
  TESSEL_CHECK(start_dim <= end_dim, InvalidArgument, "flatten: start dim {} after end dim {}",
               start_dim, end_dim);
  Shape shape(t.shape().begin(), t.shape().begin() + start_dim);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= t.shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), t.shape().begin() + end_dim + 1, t.shape().end());
  return reshape(t, shape);
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  const int64_t rank = t.dim();
  TESSEL_CHECK(static_cast<int64_t>(dims.size()) == rank, InvalidArgument,
               "permute: {} dims given for a tensor of shape {}", dims.size(),
               shape_str(t.shape()));
  std::vector<int64_t> order(rank), inverse(rank, -1);
  Shape shape(rank);
  Strides strides(rank);
  for (int64_t i = 0; i < rank; ++i) {
    order[i] = wrap_dim(dims[i], rank);
    TESSEL_CHECK(inverse[order[i]] < 0, InvalidArgument, "permute: dim {} repeated in {}", order[i],
                 shape_str(dims));
    inverse[order[i]] = i;
    shape[i] = t.shape()[order[i]];
    strides[i] = t.strides()[order[i]];
  }
  return record_view("permute", t, t.as_strided(shape, strides, t.offset()),
                     [&] { return [inverse](const Tensor& g) { return permute(g, inverse); }; });
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[wrap_dim(dim0, t.dim())], order[wrap_dim(dim1, t.dim())]);
  return permute(t, order);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrap_dim(dim, t.dim());
  TESSEL_CHECK(step >= 1, InvalidArgument, "slice: step must be >= 1, got {}", step);
  const int64_t size = t.shape()[dim];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = t.shape();
  Strides strides = t.strides();
  shape[dim] = (end - start + step - 1) / step;
  strides[dim] *= step;
  return record_view(
      "slice", t, t.as_strided(shape, strides, t.offset() + start * t.strides()[dim]), [&] {
        return [in_shape = t.shape(), dtype = t.dtype(), device = t.device(), dim, start, end,
                step](const Tensor& g) {
          return scatter_into_zeros(in_shape, dtype, device, g, [&](const Tensor& z) {
            return slice(z, dim, start, end, step);
          });
        };
      });
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = wrap_dim(dim, t.dim());
  TESSEL_CHECK(start >= 0 && length >= 0 && start + length <= t.shape()[d], OutOfRange,
               "narrow: [{}, {}) is outside dim {} of size {} (shape {})", start, start + length, d,
               t.shape()[d], shape_str(t.shape()));
  return slice(t, d, start, start + length);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  const int64_t d = wrap_dim(dim, t.dim());
  const int64_t size = t.shape()[d];
  TESSEL_CHECK(index >= -size && index < size, OutOfRange,
               "select: index {} is out of range for dim {} of size {}", index, d, size);
  return squeeze(narrow(t, d, index < 0 ? index + size : index, 1), d);
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  const int64_t d = wrap_dim(dim, t.dim() + 1);
  Shape shape = t.shape();
  shape.insert(shape.begin() + d, 1);
  return view(t, shape);
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  const int64_t d = wrap_dim(dim, t.dim());
  TESSEL_CHECK(t.shape()[d] == 1, InvalidArgument, "squeeze: dim {} of shape {} is not 1", d,
               shape_str(t.shape()));
  Shape shape = t.shape();
  shape.erase(shape.begin() + d);
  return view(t, shape);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  TESSEL_CHECK(shape.size() >= t.shape().size(), InvalidArgument,
               "expand: cannot expand shape {} to fewer dims {}", shape_str(t.shape()),
               shape_str(shape));
  Shape target = shape;
  const size_t lead = shape.size() - t.shape().size();
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t have = i < lead ? 1 : t.shape()[i - lead];
    if (target[i] == -1) target[i] = have;
    TESSEL_CHECK(have == target[i] || have == 1, InvalidArgument,
                 "expand: shape {} cannot expand to {} (dim {})", shape_str(t.shape()),
                 shape_str(shape), i);
  }
  return record_view("expand", t, internal::broadcast_view(t, target), [&] {
    return [in_shape = t.shape()](const Tensor& g) { return sum_to(g, in_shape); };
  });
}

std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim) {
  const int64_t d = wrap_dim(dim, t.dim());
  TESSEL_CHECK(split_size >= 1, InvalidArgument, "split: split size must be >= 1, got {}",
               split_size);
  // The pieces are views recorded as one node, whose backward writes every piece's gradient
  // into one tensor (rather than one zero-filled tensor per piece, summed).
  std::vector<Tensor> pieces;
  std::vector<int64_t> sizes;
  const int64_t size = t.shape()[d];
  for (int64_t start = 0; start < size || (size == 0 && pieces.empty()); start += split_size) {
    const int64_t length = std::min(split_size, size - start);
    Shape shape = t.shape();
    shape[d] = length;
    pieces.push_back(t.as_strided(shape, t.strides(), t.offset() + start * t.strides()[d]));
    sizes.push_back(length);
    if (size == 0) break;
  }
  if (needs_grad({t})) {
    record_op("split", {t}, pieces,
              [d, sizes, shape = t.shape(), dtype = t.dtype(),
               device = t.device()](const std::vector<Tensor>& g) {
                Tensor gx = empty(shape, dtype, device);
                int64_t start = 0;
                for (size_t i = 0; i < sizes.size(); ++i) {
                  copy_(narrow(gx, d, start, sizes[i]), g[i]);
                  start += sizes[i];
                }
                return std::vector<Tensor>{gx};
              });
  }
  return pieces;
}

std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim) {
  TESSEL_CHECK(chunks >= 1, InvalidArgument, "chunk: chunks must be >= 1, got {}", chunks);
  const int64_t size = t.shape()[wrap_dim(dim, t.dim())];
  return split(t, std::max<int64_t>(1, (size + chunks - 1) / chunks), dim);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TESSEL_CHECK(!tensors.empty(), InvalidArgument, "cat: no tensors given");
  const Tensor& first = tensors[0];
  const int64_t d = wrap_dim(dim, first.dim());
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    TESSEL_CHECK(t.dim() == first.dim() && t.dtype() == first.dtype(), InvalidArgument,
                 "cat: tensor {} is {} but tensor 0 is {}", i, t.str(), first.str());
    internal::check_same_device("cat", first, t);
    for (int64_t k = 0; k < t.dim(); ++k) {
      TESSEL_CHECK(k == d || t.shape()[k] == first.shape()[k], InvalidArgument,
                   "cat along dim {}: tensor {} has shape {} but tensor 0 has {}", d, i,
                   shape_str(t.shape()), shape_str(first.shape()));
    }
    shape[d] += t.shape()[d];
  }
  Tensor out = empty(shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    internal::backend_of(out).copy(t, narrow(detach(out), d, at, t.shape()[d]));
    sizes.push_back(t.shape()[d]);
    at += t.shape()[d];
  }
  if (needs_grad(tensors)) {
    record_op("cat", tensors, {out}, [d, sizes](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads;
      int64_t start = 0;
      for (int64_t s : sizes) {
        grads.push_back(narrow(g[0], d, start, s));
        start += s;
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TESSEL_CHECK(!tensors.empty(), InvalidArgument, "stack: no tensors given");
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1);
  std::vector<Tensor> expanded;
  for (const Tensor& t : tensors) expanded.push_back(unsqueeze(t, d));
  return cat(expanded, d);
}

}  // namespace tessel
