#include "tessel/parallel/dtensor/dtensor_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tessel/base/error.h"

namespace tessel {

std::pair<int64_t, int64_t> chain_region(int64_t size, const std::vector<int64_t>& chain,
                                         const std::vector<int64_t>& mesh_shape,
                                         const std::vector<int64_t>& coordinate) {
  int64_t offset = 0, length = size;
  for (int64_t m : chain) {
    const auto [o, n] = chunk_of(length, mesh_shape[m], coordinate[m]);
    offset += o;
    length = n;
  }
  return {offset, length};
}

std::string typed_shape_str(DType dtype, const Shape& shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return fmt::format("{}[{}]", dtype_name(dtype), dims);
}

DTensorSpec::DTensorSpec(DeviceMesh mesh, std::vector<Placement> placements, Shape global_shape,
                         DType dtype, std::vector<int64_t> shard_order)
    : mesh_(std::move(mesh)),
      placements_(std::move(placements)),
      global_shape_(std::move(global_shape)),
      dtype_(dtype),
      shard_order_(std::move(shard_order)) {
  validate_and_normalise();
}

void DTensorSpec::validate_and_normalise() {
  const int64_t ndim = mesh_.ndim();
  const int64_t rank = static_cast<int64_t>(global_shape_.size());
  TESSEL_CHECK(static_cast<int64_t>(placements_.size()) == ndim, InvalidArgument,
               "placements {} give {} placement{} for mesh {} of {} dimension{}",
               placements_str(placements_), placements_.size(), placements_.size() == 1 ? "" : "s",
               mesh_.shape_str(), ndim, ndim == 1 ? "" : "s");
  for (int64_t s : global_shape_) {
    TESSEL_CHECK(s >= 0, InvalidArgument, "global shape {} has a negative size",
                 shape_str(global_shape_));
  }
  bool has_extreme = false;
  std::vector<ReduceOp> ops;
  for (Placement& p : placements_) {
    if (p.is_shard()) {
      const int64_t d = p.dim() < 0 ? p.dim() + rank : p.dim();
      TESSEL_CHECK(d >= 0 && d < rank, InvalidArgument,
                   "{} on mesh {}: Shard({}) is beyond a tensor of {} dimension{} (global {})",
                   placements_str(placements_), mesh_.shape_str(), p.dim(), rank,
                   rank == 1 ? "" : "s", shape_str(global_shape_));
      p = Shard{d};
    } else if (p.is_partial()) {
      ops.push_back(p.op());
      has_extreme = has_extreme || p.op() == ReduceOp::kMax || p.op() == ReduceOp::kMin ||
                    p.op() == ReduceOp::kProduct;
    }
  }
  if (has_extreme) {
    for (ReduceOp op : ops) {
      TESSEL_CHECK(op == ops[0], InvalidArgument,
                   "placements {} mix Partial({}) with Partial({}): the reductions do not "
                   "commute, so the global tensor is not defined",
                   placements_str(placements_), reduce_op_name(ops[0]), reduce_op_name(op));
    }
  }
  if (shard_order_.empty()) {
    shard_order_.resize(static_cast<size_t>(ndim));
    std::iota(shard_order_.begin(), shard_order_.end(), 0);
  } else {
    std::vector<int64_t> sorted = shard_order_;
    std::sort(sorted.begin(), sorted.end());
    bool permutation = static_cast<int64_t>(sorted.size()) == ndim;
    for (int64_t i = 0; permutation && i < ndim; ++i) permutation = sorted[i] == i;
    std::string order;
    for (int64_t m : shard_order_) order += fmt::format("{}{}", order.empty() ? "" : ", ", m);
    TESSEL_CHECK(permutation, InvalidArgument,
                 "shard order ({}) is not a permutation of the {} dimensions of mesh {}", order,
                 ndim, mesh_.shape_str());
  }
}

std::vector<std::vector<int64_t>> DTensorSpec::shard_chains() const {
  std::vector<std::vector<int64_t>> chains(global_shape_.size());
  for (int64_t m : shard_order_) {
    const Placement& p = placements_[static_cast<size_t>(m)];
    if (p.is_shard()) chains[static_cast<size_t>(p.dim())].push_back(m);
  }
  return chains;
}

std::pair<Shape, Shape> DTensorSpec::region(const std::vector<int64_t>& coordinate) const {
  const auto chains = shard_chains();
  const std::vector<int64_t> mesh_shape = mesh_.shape();
  Shape offset(global_shape_.size()), size(global_shape_.size());
  for (size_t d = 0; d < global_shape_.size(); ++d) {
    const auto [o, n] = chain_region(global_shape_[d], chains[d], mesh_shape, coordinate);
    offset[d] = o;
    size[d] = n;
  }
  return {offset, size};
}

DTensorSpec DTensorSpec::with_placements(std::vector<Placement> placements,
                                         std::vector<int64_t> shard_order) const {
  return DTensorSpec(mesh_, std::move(placements), global_shape_, dtype_, std::move(shard_order));
}

std::string DTensorSpec::str() const {
  std::string out =
      fmt::format("global {}, mesh {}, placements {}", typed_shape_str(dtype_, global_shape_),
                  mesh_.shape_str(), placements_str(placements_));
  bool default_order = true;
  for (size_t i = 0; i < shard_order_.size(); ++i) {
    default_order = default_order && shard_order_[i] == static_cast<int64_t>(i);
  }
  if (!default_order) {
    std::string order;
    const auto names = mesh_.dim_names();
    for (int64_t m : shard_order_) order += (order.empty() ? "" : ", ") + names[m];
    out += fmt::format(", shard order ({})", order);
  }
  return out;
}

}  // namespace tessel
