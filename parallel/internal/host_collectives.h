#pragma once
// Private: collectives over small host values (shapes, hashes, flags, text) for the checks and
// bookkeeping of DTensor, FSDP, DDP and checkpoints. The values travel through the group's
// default device (the CPU, or the GPU of an NCCL group, which moves device memory only), so the
// same code runs over every backend. Blocking: every rank of the group calls them in the same
// order, like any collective; they throw as the collectives do.

#include <cstdint>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/reduce_op.h"
#include "tessel/collectives/process_group.h"

namespace tessel::internal {

// Every rank's `mine` (the same length on every rank), concatenated in rank order. The result
// starts as this rank's values repeated, so a transport that moves no data (the fake backend)
// finds every rank in agreement.
std::vector<int64_t> all_gather_values(ProcessGroup& group, const std::vector<int64_t>& mine,
                                       Nanoseconds timeout = Nanoseconds::zero());
// `values` reduced element-wise over the group.
std::vector<int64_t> all_reduce_values(ProcessGroup& group, const std::vector<int64_t>& values,
                                       ReduceOp op, Nanoseconds timeout = Nanoseconds::zero());
// Rank `root`'s value on every rank.
int64_t broadcast_value(ProcessGroup& group, int64_t value, int root,
                        Nanoseconds timeout = Nanoseconds::zero());

}  // namespace tessel::internal
