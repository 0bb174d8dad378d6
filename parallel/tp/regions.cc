// Tensor- and sequence-parallel regions: the collectives along one tensor dimension and their
// autograd functions. See regions.h.
#include "tessel/parallel/tp/regions.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using Group = std::shared_ptr<ProcessGroup>;

int64_t normalise_dim(const Tensor& x, int64_t dim, const char* op) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  TESSEL_CHECK(d >= 0 && d < x.dim(), InvalidArgument, "{}: dimension {} is outside {}", op, dim,
               x.str());
  return d;
}

// The size of each rank's piece of a span of `total` (torch.chunk's sizes).
std::vector<int64_t> piece_sizes(int64_t total, int parts) {
  std::vector<int64_t> sizes(static_cast<size_t>(parts));
  for (int r = 0; r < parts; ++r) sizes[r] = chunk_of(total, parts, r).second;
  return sizes;
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Elements before / after dimension d.
std::pair<int64_t, int64_t> outer_inner(const Shape& shape, int64_t d) {
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  return {outer, inner};
}

Shape with_size(Shape shape, int64_t d, int64_t size) {
  shape[d] = size;
  return shape;
}

void check_even(const Tensor& x, int64_t d, int parts, const char* op) {
  TESSEL_CHECK(x.size(d) % parts == 0, InvalidArgument,
               "{}: dimension {} of {} has size {}, which does not split evenly over the {} "
               "ranks of the tensor-parallel group (sequence shards are even: make it a "
               "multiple of {})",
               op, d, x.str(), x.size(d), parts, parts);
}

// The rank-major flat buffer of a collective along d <-> the tensor: rank r's piece of d at
// `offset` r. With nothing before d the buffer is the tensor itself (no copy).
Tensor unpack(const Tensor& flat, const Shape& shape, int64_t d,
              const std::vector<int64_t>& sizes) {
  const auto [outer, inner] = outer_inner(shape, d);
  if (outer == 1) return view(flat, shape);
  Tensor out = empty(shape, flat.dtype(), flat.device());
  int64_t at = 0, offset = 0;
  for (int64_t s : sizes) {
    const Tensor piece = narrow(out, d, offset, s);
    if (s > 0) copy_(piece, view(narrow(flat, 0, at, outer * s * inner), piece.shape()));
    at += outer * s * inner;
    offset += s;
  }
  return out;
}

Tensor pack(const Tensor& x, int64_t d, const std::vector<int64_t>& sizes) {
  const auto [outer, inner] = outer_inner(x.shape(), d);
  if (outer == 1) return reshape(contiguous(x), {x.numel()});
  Tensor flat = empty({x.numel()}, x.dtype(), x.device());
  int64_t at = 0, offset = 0;
  for (int64_t s : sizes) {
    const Tensor piece = narrow(x, d, offset, s);
    if (s > 0) copy_(view(narrow(flat, 0, at, piece.numel()), piece.shape()), piece);
    at += piece.numel();
    offset += s;
  }
  return flat;
}

std::vector<int64_t> counts_of(const Shape& shape, int64_t d, const std::vector<int64_t>& sizes) {
  const auto [outer, inner] = outer_inner(shape, d);
  std::vector<int64_t> counts;
  for (int64_t s : sizes) counts.push_back(outer * s * inner);
  return counts;
}

// ---- The collectives along one dimension (not recorded by autograd) --------------------------

Tensor all_gather_dim(const Tensor& x, ProcessGroup& g, int64_t d,
                      const std::vector<int64_t>& sizes) {
  NoGradGuard no_grad;
  const Shape full = with_size(x.shape(), d, sum_of(sizes));
  const std::vector<int64_t> counts = counts_of(full, d, sizes);
  Tensor flat = empty({sum_of(counts)}, x.dtype(), x.device());
  g.all_gather(reshape(contiguous(x), {x.numel()}), flat, {.counts = counts});
  return unpack(flat, full, d, sizes);
}

Tensor reduce_scatter_dim(const Tensor& x, ProcessGroup& g, int64_t d,
                          const std::vector<int64_t>& sizes) {
  NoGradGuard no_grad;
  const std::vector<int64_t> counts = counts_of(x.shape(), d, sizes);
  Tensor out = empty(with_size(x.shape(), d, sizes[g.rank()]), x.dtype(), x.device());
  Tensor out_flat = view(out, {out.numel()});
  g.reduce_scatter(pack(x, d, sizes), out_flat, {.counts = counts});
  return out;
}

Tensor piece_of(const Tensor& x, int rank, int64_t d, const std::vector<int64_t>& sizes) {
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += sizes[r];
  return contiguous(narrow(x, d, offset, sizes[rank]));
}

Tensor all_reduce_copy(const Tensor& x, ProcessGroup& g) {
  NoGradGuard no_grad;
  Tensor out = clone(x);
  g.all_reduce(out);
  return out;
}

// One autograd function of x: forward `fwd`, backward `bwd` on the gradient.
Tensor region(const char* name, const Tensor& x, std::function<Tensor(const Tensor&)> fwd,
              std::function<Tensor(const Tensor&)> bwd) {
  return apply_function(
             name, {x},
             [&fwd](FunctionContext&, const std::vector<Tensor>& in) {
               return std::vector<Tensor>{fwd(in[0])};
             },
             [bwd = std::move(bwd)](FunctionContext&, const std::vector<Tensor>& g) {
               return std::vector<Tensor>{bwd(g[0])};
             })
      .at(0);
}

}  // namespace

Tensor copy_to_tp_region(const Tensor& x, const Group& group) {
  return region(
      "copy_to_tp_region", x, [](const Tensor& t) { return t; },
      [group](const Tensor& g) { return all_reduce_copy(g, *group); });
}

Tensor reduce_from_tp_region(const Tensor& x, const Group& group) {
  return region(
      "reduce_from_tp_region", x, [&group](const Tensor& t) { return all_reduce_copy(t, *group); },
      [](const Tensor& g) { return g; });
}

Tensor scatter_to_tp_region(const Tensor& x, const Group& group, int64_t dim) {
  const int64_t d = normalise_dim(x, dim, "scatter_to_tp_region");
  const std::vector<int64_t> sizes = piece_sizes(x.size(d), group->size());
  return region(
      "scatter_to_tp_region", x,
      [&](const Tensor& t) { return piece_of(t, group->rank(), d, sizes); },
      [group, d, sizes](const Tensor& g) { return all_gather_dim(g, *group, d, sizes); });
}

Tensor gather_from_tp_region(const Tensor& x, const Group& group, int64_t dim,
                             int64_t global_size) {
  const int64_t d = normalise_dim(x, dim, "gather_from_tp_region");
  const int64_t total = global_size >= 0 ? global_size : x.size(d) * group->size();
  const std::vector<int64_t> sizes = piece_sizes(total, group->size());
  TESSEL_CHECK(sizes[group->rank()] == x.size(d), InvalidArgument,
               "gather_from_tp_region: {} holds {} of dimension {} but rank {}'s piece of {} "
               "is {}",
               x.str(), x.size(d), d, group->rank(), total, sizes[group->rank()]);
  return region(
      "gather_from_tp_region", x,
      [&](const Tensor& t) { return all_gather_dim(t, *group, d, sizes); },
      [group, d, sizes](const Tensor& g) { return piece_of(g, group->rank(), d, sizes); });
}

Tensor gather_from_sp_region(const Tensor& x, const Group& group, int64_t dim) {
  const int64_t d = normalise_dim(x, dim, "gather_from_sp_region");
  const std::vector<int64_t> sizes(static_cast<size_t>(group->size()), x.size(d));
  return region(
      "gather_from_sp_region", x,
      [&](const Tensor& t) { return all_gather_dim(t, *group, d, sizes); },
      [group, d, sizes](const Tensor& g) { return reduce_scatter_dim(g, *group, d, sizes); });
}

Tensor reduce_scatter_to_sp_region(const Tensor& x, const Group& group, int64_t dim) {
  const int64_t d = normalise_dim(x, dim, "reduce_scatter_to_sp_region");
  check_even(x, d, group->size(), "reduce_scatter_to_sp_region");
  const std::vector<int64_t> sizes = piece_sizes(x.size(d), group->size());
  return region(
      "reduce_scatter_to_sp_region", x,
      [&](const Tensor& t) { return reduce_scatter_dim(t, *group, d, sizes); },
      [group, d, sizes](const Tensor& g) { return all_gather_dim(g, *group, d, sizes); });
}

// ---- all_gather_linear -----------------------------------------------------------------------

namespace {

// What forward keeps for backward: the gathered input.
struct GatherLinearState {
  Tensor gathered;
};

}  // namespace

Tensor all_gather_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Group& group, int64_t dim, int64_t chunks) {
  const int64_t d = normalise_dim(x, dim, "all_gather_linear");
  TESSEL_CHECK(d < x.dim() - 1, InvalidArgument,
               "all_gather_linear: the gathered dimension {} of {} must not be the features", d,
               x.str());
  const int parts = group->size();
  const int me = group->rank();
  const int64_t local = x.size(d);
  const int64_t k = std::clamp<int64_t>(chunks, 1, std::max<int64_t>(local, 1));
  std::vector<Tensor> inputs = {x, weight};
  if (bias.defined()) inputs.push_back(bias);

  auto forward = [&](FunctionContext& ctx, const std::vector<Tensor>& in) {
    const Tensor& w = in[1];
    const Tensor b = in.size() > 2 ? in[2] : Tensor();
    // Issue every chunk's all_gather first: they run one after another on the group's worker.
    struct Chunk {
      int64_t offset, size;
      Tensor flat;
      Work work;
    };
    std::vector<Chunk> pieces;
    for (int64_t j = 0; j < k; ++j) {
      const auto [offset, size] = chunk_of(local, k, j);
      const Tensor mine = contiguous(narrow(in[0], d, offset, size));
      Chunk c{offset, size, empty({mine.numel() * parts}, mine.dtype(), mine.device()), Work()};
      c.work = group->all_gather(view(mine, {mine.numel()}), c.flat, {.async = true});
      pieces.push_back(std::move(c));
    }
    const Shape full_in = with_size(in[0].shape(), d, local * parts);
    Tensor gathered = empty(full_in, in[0].dtype(), in[0].device());
    Shape full_out = full_in;
    full_out.back() = w.size(0);
    Tensor out = empty(full_out, in[0].dtype(), in[0].device());
    // This rank's rows need no communication: multiply them while the chunks travel.
    copy_(narrow(out, d, me * local, local), linear(in[0], w, b));
    copy_(narrow(gathered, d, me * local, local), in[0]);
    for (Chunk& c : pieces) {
      c.work.wait();
      const Shape piece_shape = with_size(in[0].shape(), d, c.size);
      const int64_t n = shape_numel(piece_shape);
      for (int r = 0; r < parts; ++r) {
        if (r == me || c.size == 0) continue;
        const Tensor piece = view(narrow(c.flat, 0, r * n, n), piece_shape);
        copy_(narrow(gathered, d, r * local + c.offset, c.size), piece);
        copy_(narrow(out, d, r * local + c.offset, c.size), linear(piece, w, b));
      }
    }
    ctx.data = GatherLinearState{gathered};
    ctx.save_for_backward({w});
    return std::vector<Tensor>{out};
  };

  auto backward = [group, d, parts, local](FunctionContext& ctx, const std::vector<Tensor>& g) {
    const Tensor& w = ctx.saved_tensors()[0];
    const Tensor& gathered = std::any_cast<const GatherLinearState&>(ctx.data).gathered;
    const Tensor dy = contiguous(g[0]);
    std::vector<Tensor> grads(ctx.num_inputs());
    const int64_t out_features = dy.size(-1);
    const Tensor dy2 = reshape(dy, {-1, out_features});  // 2-D: the matmuls' fast path
    // The input's gradient leaves first; the weight's is computed while it travels.
    Tensor dx;
    Work work;
    const std::vector<int64_t> sizes(static_cast<size_t>(parts), local);
    if (ctx.needs_input_grad(0)) {
      Shape in_shape = dy.shape();
      in_shape.back() = w.size(1);
      const Tensor partial = view(matmul(dy2, w), in_shape);  // this rank's columns' share
      const std::vector<int64_t> counts = counts_of(partial.shape(), d, sizes);
      dx = empty(with_size(partial.shape(), d, local), partial.dtype(), partial.device());
      Tensor dx_flat = view(dx, {dx.numel()});
      work = group->reduce_scatter(pack(partial, d, sizes), dx_flat,
                                   {.counts = counts, .async = true});
    }
    if (ctx.needs_input_grad(1)) {
      grads[1] = matmul(transpose(dy2, 0, 1), reshape(gathered, {-1, gathered.size(-1)}));
    }
    if (grads.size() > 2 && ctx.needs_input_grad(2)) grads[2] = sum(dy2, {0});
    if (dx.defined()) {
      work.wait();
      grads[0] = dx;
    }
    return grads;
  };
  return apply_function("all_gather_linear", inputs, forward, backward).at(0);
}

}  // namespace tessel
