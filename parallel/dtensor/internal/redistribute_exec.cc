// Runs a redistribution plan: each step's arithmetic (this rank's piece sizes along the step's
// tensor dimensions) is computed once per (layout, coordinate, specs) and cached; each run then
// issues the steps' collectives on the mesh's groups.
#include "tessel/parallel/dtensor/internal/redistribute_exec.h"

#include <limits>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "tessel/base/error.h"
#include "tessel/parallel/dtensor/internal/redistribute_plan.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::internal {
namespace {

using Kind = RedistributeStep::Kind;

// One step with this rank's arithmetic done.
struct CompiledStep {
  RedistributeStep step;
  std::string group_dim;        // the mesh dimension's name
  int64_t parts = 1;            // ranks along the mesh dimension
  int64_t index = 0;            // this rank's index along it
  std::vector<int64_t> piece;   // each index's piece length along `dim` of the parent span
  std::vector<int64_t> piece2;  // kAllToAll: each index's piece length along `dim2`
  int64_t parent = 0;           // the parent span's length along `dim`
  int64_t parent2 = 0;          // kAllToAll: along `dim2`
};

std::vector<int64_t> pieces(int64_t span, int64_t parts) {
  std::vector<int64_t> out(static_cast<size_t>(parts));
  for (int64_t r = 0; r < parts; ++r) out[r] = chunk_of(span, parts, r).second;
  return out;
}

std::vector<CompiledStep> compile(const DTensorSpec& src, const DTensorSpec& dst) {
  const int64_t ndim = static_cast<int64_t>(src.global_shape().size());
  const std::vector<int64_t> mesh_shape = src.mesh().shape();
  const std::vector<int64_t> coord = src.mesh().coordinate();
  const std::vector<std::string> names = src.mesh().dim_names();
  std::vector<CompiledStep> out;
  for (RedistributeStep& step : plan_redistribute(src.placements(), src.shard_order(),
                                                  dst.placements(), dst.shard_order(), ndim)) {
    CompiledStep c;
    const int64_t m = step.mesh_dim;
    c.group_dim = names[m];
    c.parts = mesh_shape[m];
    c.index = coord[m];
    // The span this step splits or joins: the dimension's region without m's split.
    auto parent_of = [&](int64_t d) {
      std::vector<int64_t> chain = step.chains[d];
      if (!chain.empty() && chain.back() == m) chain.pop_back();
      return chain_region(src.global_shape()[d], chain, mesh_shape, coord).second;
    };
    if (step.dim >= 0) {
      c.parent = parent_of(step.dim);
      c.piece = pieces(c.parent, c.parts);
    }
    if (step.dim2 >= 0) {
      c.parent2 = parent_of(step.dim2);
      c.piece2 = pieces(c.parent2, c.parts);
    }
    c.step = std::move(step);
    out.push_back(std::move(c));
  }
  return out;
}

// What a plan depends on: the mesh layout and this rank's coordinate in it, the global shape
// and dtype, and both placements with their orders. Kept by value to check a hash match.
struct PlanKey {
  std::vector<MeshDim> layout;
  std::vector<int64_t> coordinate;
  Shape shape;
  DType dtype;
  std::vector<Placement> from, to;
  std::vector<int64_t> from_order, to_order;

  bool matches(const DTensorSpec& src, const DTensorSpec& dst,
               const std::vector<int64_t>& coord) const {
    if (dtype != src.dtype() || shape != src.global_shape() || from != src.placements() ||
        to != dst.placements() || from_order != src.shard_order() ||
        to_order != dst.shard_order() || coordinate != coord) {
      return false;
    }
    const std::vector<MeshDim>& dims = src.mesh().layout().dims();
    if (dims.size() != layout.size()) return false;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i].name != layout[i].name || dims[i].modes != layout[i].modes) return false;
    }
    return true;
  }
};

uint64_t mix(uint64_t h, uint64_t v) {  // boost-style combine on a 64-bit golden ratio
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

uint64_t plan_hash(const DTensorSpec& src, const DTensorSpec& dst,
                   const std::vector<int64_t>& coord) {
  uint64_t h = static_cast<uint64_t>(src.dtype());
  for (const MeshDim& dim : src.mesh().layout().dims()) {
    h = mix(h, std::hash<std::string>{}(dim.name));
    for (const MeshMode& mode : dim.modes) h = mix(mix(h, mode.size), mode.stride);
  }
  for (int64_t c : coord) h = mix(h, c);
  for (int64_t s : src.global_shape()) h = mix(h, s);
  for (const auto* ps : {&src.placements(), &dst.placements()}) {
    h = mix(h, ps->size());
    for (const Placement& p : *ps) {
      h = mix(h, static_cast<uint64_t>(p.kind()) << 16 |
                     static_cast<uint64_t>(p.is_shard() ? p.dim() : static_cast<int>(p.op())));
    }
  }
  for (int64_t m : src.shard_order()) h = mix(h, m);
  for (int64_t m : dst.shard_order()) h = mix(h, m + 1000);
  return h;
}

// Compiled plans by PlanKey, looked up by its hash with no string built per call. Bounded:
// cleared when it grows past the limit (training reuses a handful of specs; a sweep over many
// shapes should not grow without end).
class PlanCache {
 public:
  std::shared_ptr<const std::vector<CompiledStep>> get(const DTensorSpec& src,
                                                       const DTensorSpec& dst) {
    const std::vector<int64_t> coord = src.mesh().coordinate();
    const uint64_t hash = plan_hash(src, dst, coord);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto [first, last] = plans_.equal_range(hash);
      for (auto it = first; it != last; ++it) {
        if (it->second.key.matches(src, dst, coord)) return it->second.plan;
      }
    }
    auto plan = std::make_shared<const std::vector<CompiledStep>>(compile(src, dst));
    Entry entry{{src.mesh().layout().dims(), coord, src.global_shape(), src.dtype(),
                 src.placements(), dst.placements(), src.shard_order(), dst.shard_order()},
                plan};
    std::lock_guard<std::mutex> lock(mu_);
    if (plans_.size() >= kLimit) plans_.clear();
    plans_.emplace(hash, std::move(entry));
    return plan;
  }

 private:
  struct Entry {
    PlanKey key;
    std::shared_ptr<const std::vector<CompiledStep>> plan;
  };
  static constexpr size_t kLimit = 4096;
  std::mutex mu_;
  std::unordered_multimap<uint64_t, Entry> plans_;
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;  // never destroyed: used until process exit
  return *cache;
}

// t with dimension d moved to the front (a view), and back.
Tensor to_front(const Tensor& t, int64_t d) {
  if (d == 0) return t;
  std::vector<int64_t> order = {d};
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i != d) order.push_back(i);
  }
  return permute(t, order);
}
Tensor from_front(const Tensor& t, int64_t d) {
  if (d == 0) return t;
  std::vector<int64_t> order;
  for (int64_t i = 1; i <= d; ++i) order.push_back(i);
  order.push_back(0);
  for (int64_t i = d + 1; i < t.dim(); ++i) order.push_back(i);
  return permute(t, order);
}

// Elements per index of dimension 0 of `shape` (the product of the others).
int64_t inner_of(const Shape& shape) {
  int64_t inner = 1;
  for (size_t i = 1; i < shape.size(); ++i) inner *= shape[i];
  return inner;
}

std::vector<int64_t> scaled(const std::vector<int64_t>& counts, int64_t factor) {
  std::vector<int64_t> out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out[i] = counts[i] * factor;
  return out;
}

// The value that leaves `op` unchanged, in `dtype`'s range.
double identity_of(ReduceOp op, DType dtype) {
  const bool floating = is_floating(dtype);
  const double lowest = dtype == DType::kI64   ? -9223372036854775808.0
                        : dtype == DType::kI32 ? -2147483648.0
                                               : 0.0;
  const double highest = dtype == DType::kI64
                             ? 9223372036854774784.0  // the largest double below 2^63
                         : dtype == DType::kI32 ? 2147483647.0
                                                : 1.0;
  switch (op) {
    case ReduceOp::kMax:
      return floating ? -std::numeric_limits<double>::infinity() : lowest;
    case ReduceOp::kMin:
      return floating ? std::numeric_limits<double>::infinity() : highest;
    case ReduceOp::kProduct:
      return 1.0;
    default:
      return 0.0;
  }
}

}  // namespace

RedistributeResult run_redistribute(const Tensor& local, const DTensorSpec& src,
                                    const DTensorSpec& dst, bool async_last) {
  NoGradGuard no_grad;
  const auto plan = plan_cache().get(src, dst);
  const DeviceMesh& mesh = src.mesh();
  Tensor cur = local;
  Work work;
  for (size_t i = 0; i < plan->size(); ++i) {
    const CompiledStep& c = (*plan)[i];
    const RedistributeStep& s = c.step;
    const bool async = async_last && i + 1 == plan->size();
    const int64_t d = s.dim;
    switch (s.kind) {
      case Kind::kSlice: {
        const auto [offset, length] = chunk_of(cur.size(d), c.parts, c.index);
        cur = narrow(cur, d, offset, length);
        break;
      }
      case Kind::kAllGather: {
        const Tensor x = contiguous(to_front(cur, d));
        Shape shape = x.shape();
        shape[0] = c.parent;
        Tensor out = empty(shape, x.dtype(), x.device());
        work =
            mesh.group(c.group_dim)
                ->all_gather(x, out, {.counts = scaled(c.piece, inner_of(shape)), .async = async});
        cur = from_front(out, d);
        break;
      }
      case Kind::kReduceScatter: {
        const Tensor x = contiguous(to_front(cur, d));
        Shape shape = x.shape();
        shape[0] = c.piece[c.index];
        Tensor out = empty(shape, x.dtype(), x.device());
        work = mesh.group(c.group_dim)
                   ->reduce_scatter(
                       x, out,
                       {.op = s.op, .counts = scaled(c.piece, inner_of(shape)), .async = async});
        cur = from_front(out, d);
        break;
      }
      case Kind::kAllReduce: {
        Tensor x = clone(cur);
        work = mesh.group(c.group_dim)->all_reduce(x, {.op = s.op, .async = async});
        cur = x;
        break;
      }
      case Kind::kAllToAll: {
        // Index r gets this rank's piece of its columns along dim2; index r's piece along dim
        // lands in rows r of the result. The group moves the views as they are (strided ones
        // packed piece by piece as they go), straight into the result.
        const int64_t d2 = s.dim2;
        Shape shape = cur.shape();
        shape[d] = c.parent;
        shape[d2] = c.piece2[c.index];
        Tensor out = empty(shape, cur.dtype(), cur.device());
        std::vector<Tensor> inputs, outputs;
        int64_t offset = 0, offset2 = 0;
        for (int64_t r = 0; r < c.parts; ++r) {
          inputs.push_back(narrow(cur, d2, offset2, c.piece2[r]));
          outputs.push_back(narrow(out, d, offset, c.piece[r]));
          offset2 += c.piece2[r];
          offset += c.piece[r];
        }
        work = mesh.group(c.group_dim)
                   ->all_to_all(std::move(inputs), std::move(outputs), {.async = async});
        cur = out;
        break;
      }
      case Kind::kZeroPad: {
        Shape shape = cur.shape();
        shape[d] = c.parent;
        Tensor out = full(shape, identity_of(s.op, cur.dtype()), cur.dtype(), cur.device());
        int64_t offset = 0;
        for (int64_t r = 0; r < c.index; ++r) offset += c.piece[r];
        copy_(narrow(out, d, offset, c.piece[c.index]), cur);
        // An average over the mesh dimension divides by its size: hold the piece times that.
        if (s.op == ReduceOp::kAvg) mul_(out, static_cast<double>(c.parts));
        cur = out;
        break;
      }
      case Kind::kToPartial: {
        // Sum (and product) keep the value on index 0 only; avg, max and min on every index.
        if (c.index != 0 && (s.op == ReduceOp::kSum || s.op == ReduceOp::kProduct)) {
          cur = full(cur.shape(), identity_of(s.op, cur.dtype()), cur.dtype(), cur.device());
        }
        break;
      }
    }
  }
  if (!async_last || plan->empty()) cur = contiguous(cur);
  return {cur, work};
}

}  // namespace tessel::internal
