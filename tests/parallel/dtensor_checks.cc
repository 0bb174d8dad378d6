#include "tests/parallel/dtensor_checks.h"

#include <fmt/format.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/tensor/ops.h"
#include "tests/collectives/collective_checks.h"

namespace tessel::testing {
namespace {

using Rng = std::mt19937_64;

int64_t uniform(Rng& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Every way to write `n` as a product of 1 to 3 sizes (1 allowed).
std::vector<std::vector<int64_t>> mesh_shapes(int64_t n) {
  std::vector<std::vector<int64_t>> out = {{n}};
  for (int64_t a = 1; a <= n; ++a) {
    if (n % a) continue;
    out.push_back({a, n / a});
    for (int64_t b = 1; b <= n / a; ++b) {
      if ((n / a) % b == 0) out.push_back({a, b, n / a / b});
    }
  }
  return out;
}

// A tensor of `shape` whose element at flat index i is a small integer drawn from `seed`.
Tensor integers(const Shape& shape, DType dtype, uint64_t seed, int64_t lo, int64_t hi) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = static_cast<float>(uniform(rng, lo, hi));
  return to(from_vector<float>(v, shape), dtype);
}

// The box `region` of `global` (a contiguous copy).
Tensor box_of(const Tensor& global, const std::pair<Shape, Shape>& region) {
  Tensor t = global;
  for (size_t d = 0; d < region.first.size(); ++d) {
    t = narrow(t, static_cast<int64_t>(d), region.first[d], region.second[d]);
  }
  return contiguous(t);
}

// This rank's local tensor of a Partial layout: the box of `global` split so that reducing the
// ranks' values along every Partial mesh dimension gives the box back exactly.
Tensor partial_local(const Tensor& box, const std::vector<Placement>& placements,
                     const std::vector<int64_t>& mesh_shape, const std::vector<int64_t>& coord,
                     uint64_t seed) {
  Tensor value = box;
  for (size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].is_partial()) continue;
    const int64_t k = mesh_shape[m], i = coord[m];
    // Noise r_j per index j (the same on every rank: seeded by the mesh dim only).
    auto noise = [&](int64_t j) {
      return integers(box.shape(), box.dtype(), seed * 131 + m * 17 + static_cast<uint64_t>(j), 0,
                      3);
    };
    switch (placements[m].op()) {
      case ReduceOp::kSum: {  // index 0: value - sum of the others' noise; others: their noise
        if (i == 0) {
          for (int64_t j = 1; j < k; ++j) value = sub(value, noise(j));
        } else {
          value = noise(i);
        }
        break;
      }
      case ReduceOp::kAvg: {  // value + noise, with index 0 taking minus the others' noise
        if (i == 0) {
          for (int64_t j = 1; j < k; ++j) value = sub(value, noise(j));
        } else {
          value = add(value, noise(i));
        }
        break;
      }
      case ReduceOp::kMax:
        if (i != 0) value = sub(value, noise(i));
        break;
      case ReduceOp::kMin:
        if (i != 0) value = add(value, noise(i));
        break;
      default:
        break;
    }
  }
  return value;
}

Placement random_placement(Rng& rng, int64_t ndim, ReduceOp partial_op) {
  const int64_t kind = uniform(rng, 0, ndim > 0 ? 2 : 1);
  if (kind == 0) return Replicate{};
  if (kind == 1) return Partial{partial_op};
  return Shard{uniform(rng, 0, ndim - 1)};
}

std::vector<int64_t> random_order(Rng& rng, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

std::string values_str(const Tensor& t) {
  const std::vector<float> v = to_vector<float>(to(t, DType::kF32));
  std::string out;
  for (size_t i = 0; i < v.size() && i < 24; ++i) out += fmt::format("{}{}", i ? " " : "", v[i]);
  return out + (v.size() > 24 ? " ..." : "");
}

void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  const bool same =
      got.shape() == want.shape() && got.dtype() == want.dtype() &&
      to_vector<float>(to(got, DType::kF32)) == to_vector<float>(to(want, DType::kF32));
  if (!same) {
    throw CheckFailure(fmt::format("{}: got {} [{}], want {} [{}]", what, got.str(),
                                   values_str(got), want.str(), values_str(want)));
  }
}

// Reduces `local` over every Partial mesh dimension of `placements` with raw all_reduces (no
// DTensor code), giving this rank's box of the global tensor.
Tensor reduce_partials(const Tensor& local, const DeviceMesh& mesh,
                       const std::vector<Placement>& placements) {
  Tensor t = clone(local);
  const auto names = mesh.dim_names();
  for (size_t m = 0; m < placements.size(); ++m) {
    if (placements[m].is_partial()) {
      mesh.group(names[m])->all_reduce(t, {.op = placements[m].op()});
    }
  }
  return t;
}

}  // namespace

void check_random_redistributions(const std::shared_ptr<ProcessGroup>& world, uint64_t seed,
                                  int cases, Device device) {
  Rng rng(seed);
  const auto shapes = mesh_shapes(world->size());
  std::map<std::vector<int64_t>, std::unique_ptr<DeviceMesh>> meshes;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kI64, DType::kI32};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
  for (int c = 0; c < cases; ++c) {
    const std::vector<int64_t>& mesh_shape = shapes[uniform(rng, 0, shapes.size() - 1)];
    auto& mesh_ptr = meshes[mesh_shape];
    if (!mesh_ptr) {
      std::vector<std::string> names;
      for (size_t i = 0; i < mesh_shape.size(); ++i) names.push_back(fmt::format("d{}", i));
      mesh_ptr = std::make_unique<DeviceMesh>(init_device_mesh(world, mesh_shape, names));
    }
    const DeviceMesh& mesh = *mesh_ptr;
    const int64_t ndim = uniform(rng, 1, 3);
    Shape global_shape(static_cast<size_t>(ndim));
    for (int64_t& s : global_shape) s = uniform(rng, 0, 7);
    const DType dtype = dtypes[uniform(rng, 0, 3)];
    // Integer dtypes: avg divides; keep avg to floating dtypes.
    ReduceOp src_op = ops[uniform(rng, 0, 3)], dst_op = ops[uniform(rng, 0, 3)];
    if (!is_floating(dtype)) {
      if (src_op == ReduceOp::kAvg) src_op = ReduceOp::kSum;
      if (dst_op == ReduceOp::kAvg) dst_op = ReduceOp::kSum;
    }
    std::vector<Placement> src, dst;
    for (size_t m = 0; m < mesh_shape.size(); ++m) {
      src.push_back(random_placement(rng, ndim, src_op));
      dst.push_back(random_placement(rng, ndim, dst_op));
    }
    const std::vector<int64_t> src_order = random_order(rng, mesh.ndim());
    const std::vector<int64_t> dst_order = random_order(rng, mesh.ndim());
    const uint64_t values_seed = rng();
    const bool run_check = uniform(rng, 0, 3) == 0;
    const bool async = uniform(rng, 0, 3) == 0;
    const std::string what = fmt::format(
        "case {} on {}: mesh {} global {} from {} order [{}] to {} order [{}]", c, device.str(),
        mesh.shape_str(), typed_shape_str(dtype, global_shape), placements_str(src),
        fmt::join(src_order, ","), placements_str(dst), fmt::join(dst_order, ","));

    const Tensor global = integers(global_shape, dtype, values_seed, -8, 8);
    const DTensorSpec src_spec(mesh, src, global_shape, dtype, src_order);
    const DTensorSpec dst_spec(mesh, dst, global_shape, dtype, dst_order);
    const std::vector<int64_t> coord = mesh.coordinate();
    const Tensor src_local = to(partial_local(box_of(global, src_spec.region(coord)), src,
                                              mesh.shape(), coord, values_seed),
                                device);
    const DTensor x = DTensor::from_local(
        src_local, mesh, src,
        {.global_shape = global_shape, .shard_order = src_order, .run_check = run_check});
    if (x.local_offset() != src_spec.region(coord).first) {
      throw CheckFailure(what + ": from_local reports offset " + shape_str(x.local_offset()));
    }
    DTensor y;
    if (async) {
      AsyncDTensor pending = x.redistribute_async(dst, {.shard_order = dst_order});
      y = pending.wait();
    } else {
      y = x.redistribute(dst, {.shard_order = dst_order});
    }
    const Tensor want = box_of(global, dst_spec.region(coord));
    expect_equal(reduce_partials(y.to_local(), mesh, dst), want, what + ": redistribute");
    expect_equal(x.full_tensor(), global, what + ": full_tensor of the source");
  }
}

}  // namespace tessel::testing
