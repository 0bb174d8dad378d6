#pragma once
// Placements: how a DTensor is laid out over one dimension of its mesh.
//
//   Shard(d)       tensor dimension d is split in pieces across the mesh dimension
//                  (torch.chunk's sizes: ceil(n / k) each, the last pieces smaller or empty)
//   Replicate()    every rank along the mesh dimension holds the same values
//   Partial(op)    every rank holds a partial value; the tensor is their reduction (sum, avg,
//                  max or min) along the mesh dimension
//
//   std::vector<Placement> p = {Shard(0), Replicate()};   // 2-D mesh (dp, tp)

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/base/reduce_op.h"

namespace tessel {

// Aggregates, so Shard(0), Replicate() and Partial(ReduceOp::kAvg) read like PyTorch's.
struct Shard {
  int64_t dim = 0;
};
struct Replicate {};
struct Partial {
  ReduceOp op = ReduceOp::kSum;
};

// One of the three, as a value type. Implicit from Shard, Replicate and Partial.
class Placement {
 public:
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };

  Placement() = default;                                      // Replicate
  Placement(Shard s) : kind_(Kind::kShard), dim_(s.dim) {}    // NOLINT: implicit
  Placement(Replicate) {}                                     // NOLINT: implicit
  Placement(Partial p) : kind_(Kind::kPartial), op_(p.op) {}  // NOLINT: implicit

  Kind kind() const { return kind_; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_shard(int64_t dim) const { return kind_ == Kind::kShard && dim_ == dim; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  // The tensor dimension (Shard only).
  int64_t dim() const { return dim_; }
  // The reduction (Partial only).
  ReduceOp op() const { return op_; }

  bool operator==(const Placement& other) const {
    return kind_ == other.kind_ && (kind_ != Kind::kShard || dim_ == other.dim_) &&
           (kind_ != Kind::kPartial || op_ == other.op_);
  }
  // "Shard(0)", "Replicate()", "Partial(sum)".
  std::string str() const;

 private:
  Kind kind_ = Kind::kReplicate;
  int64_t dim_ = 0;
  ReduceOp op_ = ReduceOp::kSum;
};

// "(Shard(0), Replicate())".
std::string placements_str(const std::vector<Placement>& placements);

// The placement a gradient takes in backward, by the duality of forward placements:
// Replicate -> Partial(sum), Shard(d) -> Shard(d), Partial(any) -> Replicate. (A replicated
// value used by every rank receives one partial gradient per rank; a partial value's gradient is
// the whole gradient on every rank.)
Placement dual_placement(const Placement& p);
std::vector<Placement> dual_placements(const std::vector<Placement>& placements);

}  // namespace tessel
