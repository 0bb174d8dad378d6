#pragma once
// ReduceOp: how values are combined, shared by collectives (all_reduce, reduce_scatter), the
// flight recorder's entries and tensor reductions, so the three agree on one set of names.

#include <cstdint>
#include <string_view>

namespace tessel {

// kAvg is the sum divided by the number of values combined (the group size for collectives).
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin, kProduct };

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                             ReduceOp::kMin, ReduceOp::kProduct};

// "sum", "avg", "max", "min", "product".
constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kProduct:
      return "product";
  }
  return "unknown";
}

}  // namespace tessel
