#include "tessel/parallel/internal/host_collectives.h"

#include "tessel/tensor/ops.h"

namespace tessel::internal {
namespace {

Tensor on_group_device(ProcessGroup& group, const std::vector<int64_t>& values) {
  return to(from_vector<int64_t>(values), group.default_device());
}

}  // namespace

std::vector<int64_t> all_gather_values(ProcessGroup& group, const std::vector<int64_t>& mine,
                                       Nanoseconds timeout) {
  std::vector<int64_t> repeated;
  repeated.reserve(mine.size() * static_cast<size_t>(group.size()));
  for (int r = 0; r < group.size(); ++r) repeated.insert(repeated.end(), mine.begin(), mine.end());
  Tensor all = on_group_device(group, repeated);
  group.all_gather(on_group_device(group, mine), all, {.timeout = timeout});
  return to_vector<int64_t>(all);
}

std::vector<int64_t> all_reduce_values(ProcessGroup& group, const std::vector<int64_t>& values,
                                       ReduceOp op, Nanoseconds timeout) {
  Tensor t = on_group_device(group, values);
  group.all_reduce(t, {.op = op, .timeout = timeout});
  return to_vector<int64_t>(t);
}

int64_t broadcast_value(ProcessGroup& group, int64_t value, int root, Nanoseconds timeout) {
  Tensor t = on_group_device(group, {value});
  group.broadcast(t, {.root = root, .timeout = timeout});
  return to_vector<int64_t>(t).front();
}

}  // namespace tessel::internal
