#include "tessel/parallel/dtensor/internal/redistribute_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/base/error.h"

namespace tessel::internal {
namespace {

using Kind = RedistributeStep::Kind;
using Chains = std::vector<std::vector<int64_t>>;

// Lower runs first among the steps that can run (see the header).
int priority(Kind kind) {
  switch (kind) {
    case Kind::kSlice:
      return 0;
    case Kind::kReduceScatter:
      return 1;
    case Kind::kAllToAll:
      return 2;
    case Kind::kAllReduce:
      return 3;
    case Kind::kAllGather:
      return 4;
    case Kind::kZeroPad:
      return 5;
    case Kind::kToPartial:
      return 6;
  }
  return 7;
}

class Planner {
 public:
  Planner(const std::vector<Placement>& src, const std::vector<int64_t>& src_order,
          const std::vector<Placement>& dst, const std::vector<int64_t>& dst_order, int64_t ndim)
      : cur_(src),
        dst_(dst),
        chains_(shard_chains_of(src, src_order, ndim)),
        target_(shard_chains_of(dst, dst_order, ndim)) {}

  std::vector<RedistributeStep> run() {
    std::vector<RedistributeStep> steps;
    const size_t limit = 4 * cur_.size() + 4;  // each mesh dimension moves at most 3 times
    while (true) {
      RedistributeStep best;
      bool found = false, all_done = true;
      for (int64_t m = 0; m < static_cast<int64_t>(cur_.size()); ++m) {
        if (done(m)) continue;
        all_done = false;
        RedistributeStep step;
        if (!candidate(m, &step)) continue;
        if (!found || priority(step.kind) < priority(best.kind)) {
          best = step;
          found = true;
        }
      }
      if (all_done) return steps;
      TESSEL_CHECK(found && steps.size() < limit, Internal,
                   "redistribute planner made no progress from {} to {}", placements_str(cur_),
                   placements_str(dst_));
      best.chains = chains_;
      apply(best);
      steps.push_back(std::move(best));
    }
  }

 private:
  // Where m stands in the target chain of d (-1 when it does not split d there).
  int64_t target_position(int64_t m, int64_t d) const {
    const auto& t = target_[d];
    const auto it = std::find(t.begin(), t.end(), m);
    return it == t.end() ? -1 : static_cast<int64_t>(it - t.begin());
  }
  // The current chain of d equals the target chain up to (not including) m's place in it.
  bool ready_to_add(int64_t m, int64_t d) const {
    const int64_t pos = target_position(m, d);
    const auto& t = target_[d];
    return pos >= 0 && chains_[d] == std::vector<int64_t>(t.begin(), t.begin() + pos);
  }
  bool innermost(int64_t m, int64_t d) const {
    return !chains_[d].empty() && chains_[d].back() == m;
  }
  bool done(int64_t m) const {
    const Placement& c = cur_[m];
    if (!(c == dst_[m])) return false;
    if (!c.is_shard()) return true;
    // A split is in place when it and every split outside it match the target.
    const auto& chain = chains_[c.dim()];
    const auto it = std::find(chain.begin(), chain.end(), m);
    const size_t pos = static_cast<size_t>(it - chain.begin());
    const auto& t = target_[c.dim()];
    return pos < t.size() && std::equal(chain.begin(), it + 1, t.begin());
  }

  bool candidate(int64_t m, RedistributeStep* step) const {
    const Placement& c = cur_[m];
    const Placement& t = dst_[m];
    step->mesh_dim = m;
    if (c.is_replicate()) {
      if (t.is_shard()) {
        if (!ready_to_add(m, t.dim())) return false;
        *step = make(Kind::kSlice, m, t.dim());
        return true;
      }
      *step = make(Kind::kToPartial, m, -1, -1, t.op());  // t is Partial (c != t)
      return true;
    }
    if (c.is_partial()) {
      if (t.is_shard()) {
        if (!ready_to_add(m, t.dim())) return false;
        *step = make(Kind::kReduceScatter, m, t.dim(), -1, c.op());
        return true;
      }
      *step = make(Kind::kAllReduce, m, -1, -1, c.op());  // then kToPartial if t is Partial
      return true;
    }
    // c is Shard(d): its split can only be removed as the innermost of d.
    const int64_t d = c.dim();
    if (!innermost(m, d)) return false;
    if (t.is_shard() && t.dim() != d && ready_to_add(m, t.dim())) {
      *step = make(Kind::kAllToAll, m, d, t.dim());
      return true;
    }
    if (t.is_partial()) {
      *step = make(Kind::kZeroPad, m, d, -1, t.op());
      return true;
    }
    *step = make(Kind::kAllGather, m, d);
    return true;
  }

  static RedistributeStep make(Kind kind, int64_t m, int64_t d, int64_t d2 = -1,
                               ReduceOp op = ReduceOp::kSum) {
    RedistributeStep s;
    s.kind = kind;
    s.mesh_dim = m;
    s.dim = d;
    s.dim2 = d2;
    s.op = op;
    return s;
  }

  void apply(const RedistributeStep& s) {
    const int64_t m = s.mesh_dim;
    switch (s.kind) {
      case Kind::kSlice:
      case Kind::kReduceScatter:
        chains_[s.dim].push_back(m);
        cur_[m] = Shard{s.dim};
        break;
      case Kind::kAllToAll:
        chains_[s.dim].pop_back();
        chains_[s.dim2].push_back(m);
        cur_[m] = Shard{s.dim2};
        break;
      case Kind::kAllReduce:
        cur_[m] = Replicate{};
        break;
      case Kind::kAllGather:
        chains_[s.dim].pop_back();
        cur_[m] = Replicate{};
        break;
      case Kind::kZeroPad:
        chains_[s.dim].pop_back();
        cur_[m] = Partial{s.op};
        break;
      case Kind::kToPartial:
        cur_[m] = Partial{s.op};
        break;
    }
  }

  std::vector<Placement> cur_;
  const std::vector<Placement> dst_;
  Chains chains_;
  const Chains target_;
};

}  // namespace

std::string RedistributeStep::str() const {
  switch (kind) {
    case Kind::kSlice:
      return fmt::format("slice(mesh dim {}, tensor dim {})", mesh_dim, dim);
    case Kind::kReduceScatter:
      return fmt::format("reduce_scatter(mesh dim {}, tensor dim {}, {})", mesh_dim, dim,
                         reduce_op_name(op));
    case Kind::kAllToAll:
      return fmt::format("all_to_all(mesh dim {}, tensor dim {} -> {})", mesh_dim, dim, dim2);
    case Kind::kAllReduce:
      return fmt::format("all_reduce(mesh dim {}, {})", mesh_dim, reduce_op_name(op));
    case Kind::kAllGather:
      return fmt::format("all_gather(mesh dim {}, tensor dim {})", mesh_dim, dim);
    case Kind::kZeroPad:
      return fmt::format("zero_pad(mesh dim {}, tensor dim {}, {})", mesh_dim, dim,
                         reduce_op_name(op));
    case Kind::kToPartial:
      return fmt::format("to_partial(mesh dim {}, {})", mesh_dim, reduce_op_name(op));
  }
  return "?";
}

std::vector<std::vector<int64_t>> shard_chains_of(const std::vector<Placement>& placements,
                                                  const std::vector<int64_t>& order, int64_t ndim) {
  std::vector<std::vector<int64_t>> chains(static_cast<size_t>(ndim));
  for (int64_t m : order) {
    const Placement& p = placements[static_cast<size_t>(m)];
    if (p.is_shard()) chains[static_cast<size_t>(p.dim())].push_back(m);
  }
  return chains;
}

std::vector<RedistributeStep> plan_redistribute(const std::vector<Placement>& src,
                                                const std::vector<int64_t>& src_order,
                                                const std::vector<Placement>& dst,
                                                const std::vector<int64_t>& dst_order,
                                                int64_t ndim) {
  return Planner(src, src_order, dst, dst_order, ndim).run();
}

}  // namespace tessel::internal
