#include "tessel/parallel/dtensor/dtensor.h"

#include <fmt/format.h>

#include "tessel/base/error.h"
#include "tessel/parallel/dtensor/internal/redistribute_exec.h"
#include "tessel/parallel/internal/host_collectives.h"
#include "tessel/parallel/internal/mesh_util.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using internal::all_gather_values;
using internal::coord_str;
using internal::unravel;
using internal::whole_mesh_group;

std::vector<Placement> all_replicate(int64_t n) {
  return std::vector<Placement>(static_cast<size_t>(n), Replicate{});
}

// Gradients through Partial(max/min/product) have no defined dual; Partial(avg) divides.
void check_differentiable(const DTensorSpec& spec, const char* op) {
  for (const Placement& p : spec.placements()) {
    TESSEL_CHECK(!p.is_partial() || p.op() == ReduceOp::kSum || p.op() == ReduceOp::kAvg,
                 NotImplemented,
                 "{}: no gradient through {} (only Partial(sum) and Partial(avg) have one)", op,
                 placements_str(spec.placements()));
  }
}

// The gradient of a local tensor laid out by `forward_out` (arriving with placements
// `grad_in`, default the dual) for an input laid out by `forward_in`.
Tensor backward_redistribute(const Tensor& grad, const DTensorSpec& forward_in,
                             const DTensorSpec& forward_out,
                             const std::vector<Placement>& grad_in) {
  check_differentiable(forward_in, "backward of redistribute");
  const DTensorSpec from = forward_out.with_placements(
      grad_in.empty() ? dual_placements(forward_out.placements()) : grad_in,
      forward_out.shard_order());
  const DTensorSpec to = forward_in.with_placements(dual_placements(forward_in.placements()),
                                                    forward_in.shard_order());
  Tensor g = internal::run_redistribute(contiguous(grad), from, to, false).local;
  // d(mean of k partial values)/d(one of them) = 1/k.
  double scale = 1.0;
  const std::vector<int64_t> mesh_shape = forward_in.mesh().shape();
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    const Placement& p = forward_in.placements()[m];
    if (p.is_partial() && p.op() == ReduceOp::kAvg) scale /= static_cast<double>(mesh_shape[m]);
  }
  return scale == 1.0 ? g : mul(g, scale);
}

// A differentiable function of the local tensor: forward runs `fn` on it; backward maps the
// gradient from `out` (with `grad_in` placements) to `in`'s dual placements.
Tensor differentiable_redistribute(const char* name, const Tensor& local, const DTensorSpec& in,
                                   const DTensorSpec& out, std::vector<Placement> grad_in,
                                   const std::function<Tensor(const Tensor&)>& fn) {
  return apply_function(
             name, {local},
             [&](FunctionContext&, const std::vector<Tensor>& x) {
               return std::vector<Tensor>{fn(x[0])};
             },
             [in, out, grad_in = std::move(grad_in)](FunctionContext&,
                                                     const std::vector<Tensor>& g) {
               return std::vector<Tensor>{backward_redistribute(g[0], in, out, grad_in)};
             })
      .at(0);
}

// Every rank's (dtype, ndim, shape) of `local`, gathered over the whole mesh: rows of i64.
std::vector<std::vector<int64_t>> gather_shapes(const Tensor& local, const DeviceMesh& mesh) {
  constexpr int64_t kMaxRank = 16;
  TESSEL_CHECK(local.dim() <= kMaxRank, InvalidArgument,
               "DTensor: tensors of more than {} dimensions are not supported, got {}", kMaxRank,
               local.str());
  std::vector<int64_t> mine(2 + kMaxRank, -1);
  mine[0] = static_cast<int64_t>(local.dtype());
  mine[1] = local.dim();
  for (int64_t i = 0; i < local.dim(); ++i) mine[2 + i] = local.size(i);
  auto group = whole_mesh_group(mesh);
  const std::vector<int64_t> all = all_gather_values(*group, mine);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(group->size()));
  for (int r = 0; r < group->size(); ++r) {
    rows[r].assign(all.begin() + r * (2 + kMaxRank), all.begin() + (r + 1) * (2 + kMaxRank));
  }
  return rows;
}

Shape shape_of_row(const std::vector<int64_t>& row) {
  return Shape(row.begin() + 2, row.begin() + 2 + row[1]);
}

// The global shape from every rank's local shape: along a sharded dimension, the sum of the
// pieces over the indices of the mesh dimensions that split it (others at index 0).
Shape infer_global_shape(const std::vector<std::vector<int64_t>>& rows, const DeviceMesh& mesh,
                         const std::vector<Placement>& placements,
                         const std::vector<int64_t>& order, int64_t ndim) {
  const std::vector<int64_t> mesh_shape = mesh.shape();
  Shape global = shape_of_row(rows[0]);
  for (int64_t d = 0; d < ndim; ++d) {
    std::vector<int64_t> splitters;
    for (size_t m = 0; m < placements.size(); ++m) {
      if (placements[m].is_shard(d)) splitters.push_back(static_cast<int64_t>(m));
    }
    if (splitters.empty()) continue;
    int64_t total = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<int64_t> coord = unravel(static_cast<int64_t>(r), mesh_shape);
      bool on_axis = true;  // every non-splitting mesh dimension at index 0
      for (size_t m = 0; m < coord.size(); ++m) {
        const bool splits = std::find(splitters.begin(), splitters.end(),
                                      static_cast<int64_t>(m)) != splitters.end();
        on_axis = on_axis && (splits || coord[m] == 0);
      }
      if (on_axis) total += shape_of_row(rows[r])[d];
    }
    global[d] = total;
  }
  (void)order;
  return global;
}

}  // namespace

DTensor::DTensor(Tensor local, DTensorSpec spec)
    : spec_(std::make_shared<const DTensorSpec>(std::move(spec))), local_(std::move(local)) {
  TESSEL_CHECK(local_.defined(), InvalidArgument, "DTensor: the local tensor is undefined");
  const Shape expected = spec_->local_shape();
  TESSEL_CHECK(local_.shape() == expected && local_.dtype() == spec_->dtype(), InvalidArgument,
               "DTensor: the local tensor {} does not fit {} (this rank at mesh {} holds {})",
               local_.str(), spec_->str(), coord_str(spec_->mesh().coordinate()),
               typed_shape_str(spec_->dtype(), expected));
}

const DTensorSpec& DTensor::spec() const {
  TESSEL_CHECK(spec_ != nullptr, InvalidArgument, "use of an undefined DTensor");
  return *spec_;
}

DTensor DTensor::from_local(const Tensor& local, const DeviceMesh& mesh,
                            std::vector<Placement> placements, const FromLocalOptions& options) {
  TESSEL_CHECK(local.defined(), InvalidArgument, "from_local: the local tensor is undefined");
  TESSEL_CHECK(options.global_shape.has_value() || options.run_check, InvalidArgument,
               "from_local: without a global shape the shapes of all ranks are needed "
               "(run_check)");
  // Validate the placements against the local tensor's rank first (the same on every rank).
  const DTensorSpec local_view(mesh, placements, options.global_shape.value_or(local.shape()),
                               local.dtype(), options.shard_order);
  std::optional<DTensorSpec> spec;
  if (options.run_check) {
    const auto rows = gather_shapes(local, mesh);
    const std::vector<int64_t> mesh_shape = mesh.shape();
    for (size_t r = 0; r < rows.size(); ++r) {
      TESSEL_CHECK(rows[r][1] == local.dim() && rows[r][0] == rows[0][0], InvalidArgument,
                   "from_local: rank {} (mesh coordinate {}) holds a {}-dimensional {} tensor "
                   "but rank 0 a {}-dimensional {} one",
                   r, coord_str(unravel(static_cast<int64_t>(r), mesh_shape)), rows[r][1],
                   dtype_name(static_cast<DType>(rows[r][0])), rows[0][1],
                   dtype_name(static_cast<DType>(rows[0][0])));
    }
    const Shape global = options.global_shape.value_or(infer_global_shape(
        rows, mesh, local_view.placements(), local_view.shard_order(), local.dim()));
    spec.emplace(mesh, placements, global, local.dtype(), options.shard_order);
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<int64_t> coord = unravel(static_cast<int64_t>(r), mesh_shape);
      const Shape expected = spec->region(coord).second;
      TESSEL_CHECK(shape_of_row(rows[r]) == expected, InvalidArgument,
                   "from_local: rank {} (mesh coordinate {}) holds a local tensor of shape {} "
                   "but {} gives it {}",
                   r, coord_str(coord), shape_str(shape_of_row(rows[r])), spec->str(),
                   shape_str(expected));
    }
  } else {
    spec.emplace(local_view);
  }
  Tensor l = local;
  if (!options.grad_placements.empty() && needs_grad({local})) {
    // The local gradient arrives with the dual placements; hand it on with the stated ones.
    const DTensorSpec as_given =
        spec->with_placements(options.grad_placements, spec->shard_order());
    const DTensorSpec dual =
        spec->with_placements(dual_placements(spec->placements()), spec->shard_order());
    l = apply_function(
            "from_local", {local}, [](FunctionContext&, const std::vector<Tensor>& x) { return x; },
            [dual, as_given](FunctionContext&, const std::vector<Tensor>& g) {
              return std::vector<Tensor>{
                  internal::run_redistribute(contiguous(g[0]), dual, as_given, false).local};
            })
            .at(0);
  }
  return DTensor(l, std::move(*spec));
}

Tensor DTensor::to_local(const std::vector<Placement>& grad_placements) const {
  if (grad_placements.empty() || !needs_grad({local_})) return local_;
  const DTensorSpec& s = spec();
  const DTensorSpec as_given = s.with_placements(grad_placements, s.shard_order());
  // Identity forward; backward takes the gradient from grad_placements to the dual ones.
  return differentiable_redistribute("to_local", local_, s, as_given, grad_placements,
                                     [](const Tensor& x) { return x; });
}

DTensor DTensor::redistribute(const std::vector<Placement>& placements,
                              const RedistributeOptions& options) const {
  const DTensorSpec& src = spec();
  DTensorSpec dst = src.with_placements(placements, options.shard_order);
  if (dst.placements() == src.placements() && dst.shard_order() == src.shard_order()) {
    return *this;
  }
  Tensor out;
  if (needs_grad({local_})) {
    out = differentiable_redistribute(
        "redistribute", local_, src, dst, options.grad_placements,
        [&](const Tensor& x) { return internal::run_redistribute(x, src, dst, false).local; });
  } else {
    out = internal::run_redistribute(local_, src, dst, false).local;
  }
  return DTensor(out, std::move(dst));
}

AsyncDTensor DTensor::redistribute_async(const std::vector<Placement>& placements,
                                         const RedistributeOptions& options) const {
  const DTensorSpec& src = spec();
  DTensorSpec dst = src.with_placements(placements, options.shard_order);
  internal::RedistributeResult r = internal::run_redistribute(detach(local_), src, dst, true);
  AsyncDTensor out;
  out.result.spec_ = std::make_shared<const DTensorSpec>(std::move(dst));
  out.result.local_ = r.local;
  out.work = r.work;
  return out;
}

Tensor DTensor::full_tensor(const std::vector<Placement>& grad_placements) const {
  return redistribute(all_replicate(mesh().ndim()), {.grad_placements = grad_placements})
      .to_local();
}

DTensor DTensor::grad() const {
  const Tensor g = local_.grad();
  if (!g.defined()) return DTensor();
  const DTensorSpec& s = spec();
  return DTensor(g, s.with_placements(dual_placements(s.placements()), s.shard_order()));
}

std::string DTensor::str() const {
  if (!defined()) return "DTensor(undefined)";
  const Shape offset = local_offset();
  std::string at;
  for (size_t i = 0; i < offset.size(); ++i) at += fmt::format("{}{}", i ? ", " : "", offset[i]);
  return fmt::format("DTensor({}, local {} at offset [{}])", spec().str(),
                     typed_shape_str(local_.dtype(), local_.shape()), at);
}

DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh,
                          std::vector<Placement> placements, const DistributeOptions& options) {
  TESSEL_CHECK(full.defined(), InvalidArgument, "distribute_tensor: the tensor is undefined");
  DTensorSpec spec(mesh, std::move(placements), full.shape(), full.dtype(), options.shard_order);
  const DTensorSpec replicated = spec.with_placements(all_replicate(mesh.ndim()));
  Tensor source = full;
  if (options.src_rank >= 0) {
    TESSEL_CHECK(options.src_rank < mesh.size(), InvalidArgument,
                 "distribute_tensor: source rank {} is outside mesh {} of {} ranks",
                 options.src_rank, mesh.shape_str(), mesh.size());
    const auto rows = gather_shapes(full, mesh);
    for (size_t r = 0; r < rows.size(); ++r) {
      TESSEL_CHECK(rows[r] == rows[0], InvalidArgument,
                   "distribute_tensor: rank {} passed {} but rank 0 passed {} (every rank passes "
                   "a tensor of the global shape and dtype)",
                   r, typed_shape_str(static_cast<DType>(rows[r][0]), shape_of_row(rows[r])),
                   typed_shape_str(static_cast<DType>(rows[0][0]), shape_of_row(rows[0])));
    }
    NoGradGuard no_grad;
    Tensor buffer = clone(full);
    whole_mesh_group(mesh)->broadcast(buffer, {.root = options.src_rank});
    source = buffer;
  }
  Tensor local;
  if (needs_grad({full})) {
    local = differentiable_redistribute(
        "distribute_tensor", full, replicated, spec, {}, [&](const Tensor&) {
          return internal::run_redistribute(detach(source), replicated, spec, false).local;
        });
  } else {
    local = internal::run_redistribute(source, replicated, spec, false).local;
  }
  // A slice may share the caller's memory; the DTensor owns its piece.
  if (local.storage().is_same(full.storage())) local = clone(local);
  return DTensor(local, std::move(spec));
}

void check_same_mesh(const char* op, const DTensor& a, const DTensor& b) {
  TESSEL_CHECK(a.mesh() == b.mesh(), InvalidArgument, "{}: DTensors on different meshes: {} and {}",
               op, a.mesh().str(), b.mesh().str());
}

bool is_dtensor(const Tensor& t) {
  return t.defined() && t.shard_info() != nullptr && t.shard_info()->spec != nullptr;
}

DTensor as_dtensor(const Tensor& t) {
  TESSEL_CHECK(is_dtensor(t), InvalidArgument, "{} is not a DTensor (no spec attached)",
               t.defined() ? t.str() : "an undefined tensor");
  return DTensor(t, *std::static_pointer_cast<const DTensorSpec>(t.shard_info()->spec));
}

}  // namespace tessel
