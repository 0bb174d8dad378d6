#pragma once
// Private: the plan of a redistribution — which single-mesh-dimension steps, in which order,
// take a DTensor from one set of placements (and shard order) to another. Pure and
// deterministic: every rank computes the same plan from the same specs, so collectives line up.
//
// Steps (each along one mesh dimension m of size k):
//   kSlice         Replicate -> Shard(d)       local: keep this rank's piece of d
//   kReduceScatter Partial -> Shard(d)         reduce_scatter along d
//   kAllToAll      Shard(d) -> Shard(d2)       all_to_all: give up d's split, take d2's
//   kAllReduce     Partial -> Replicate        all_reduce
//   kAllGather     Shard(d) -> Replicate       all_gather along d
//   kZeroPad       Shard(d) -> Partial(op)     local: this rank's piece in a tensor of op's
//   identity kToPartial     Replicate -> Partial(op)    local: sum keeps the value on index 0 only
// A split can be added or removed only as the innermost one of its tensor dimension, so the
// planner first removes splits that differ from the target (innermost first) and adds the
// target's in order. Among the steps that can run, it takes the cheapest in bytes first:
// local shrinking steps, then reductions that shrink, all_to_all, all_reduce, all_gather, and
// the local growing steps last.

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/parallel/dtensor/placement.h"

namespace tessel::internal {

struct RedistributeStep {
  enum class Kind : uint8_t {
    kSlice,
    kReduceScatter,
    kAllToAll,
    kAllReduce,
    kAllGather,
    kZeroPad,
    kToPartial
  };
  Kind kind = Kind::kSlice;
  int64_t mesh_dim = 0;
  int64_t dim = -1;   // the tensor dimension (for kAllToAll: the one whose split is given up)
  int64_t dim2 = -1;  // kAllToAll: the tensor dimension that takes the split
  ReduceOp op = ReduceOp::kSum;
  // For each tensor dimension, the mesh dimensions splitting it before this step.
  std::vector<std::vector<int64_t>> chains;

  std::string str() const;  // "all_gather(mesh dim 1, tensor dim 0)"
};

// For each tensor dimension of a tensor of `ndim` dimensions, the mesh dimensions that shard it
// (in `order`, outermost first).
std::vector<std::vector<int64_t>> shard_chains_of(const std::vector<Placement>& placements,
                                                  const std::vector<int64_t>& order, int64_t ndim);

// The steps from (src, src_order) to (dst, dst_order). Placements must be valid for a tensor of
// `ndim` dimensions (one per mesh dimension, Shard dims in range, orders permutations).
std::vector<RedistributeStep> plan_redistribute(const std::vector<Placement>& src,
                                                const std::vector<int64_t>& src_order,
                                                const std::vector<Placement>& dst,
                                                const std::vector<int64_t>& dst_order,
                                                int64_t ndim);

}  // namespace tessel::internal
