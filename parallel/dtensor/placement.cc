#include "tessel/parallel/dtensor/placement.h"

#include <fmt/format.h>

namespace tessel {

std::string Placement::str() const {
  switch (kind_) {
    case Kind::kShard:
      return fmt::format("Shard({})", dim_);
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kPartial:
      return fmt::format("Partial({})", reduce_op_name(op_));
  }
  return "?";
}

std::string placements_str(const std::vector<Placement>& placements) {
  std::string out = "(";
  for (size_t i = 0; i < placements.size(); ++i) {
    out += (i ? ", " : "") + placements[i].str();
  }
  return out + ")";
}

Placement dual_placement(const Placement& p) {
  switch (p.kind()) {
    case Placement::Kind::kShard:
      return p;
    case Placement::Kind::kReplicate:
      return Partial{ReduceOp::kSum};
    case Placement::Kind::kPartial:
      return Replicate{};
  }
  return p;
}

std::vector<Placement> dual_placements(const std::vector<Placement>& placements) {
  std::vector<Placement> out;
  out.reserve(placements.size());
  for (const Placement& p : placements) out.push_back(dual_placement(p));
  return out;
}

}  // namespace tessel
