#pragma once
// The threads backend: N ranks as threads of one process, moving real data through shared
// memory. For tests of everything above collectives (mesh, FSDP, TP) and for single-process
// runs. Collectives post their buffers, meet at a barrier, copy/reduce from the other ranks'
// buffers, and meet again; reductions run in rank order, so every rank gets bit-identical
// results. Timeouts name the ranks that had not arrived.
//
// CUDA tensors too (all ranks of a call on one device type): several ranks share one GPU, which
// NCCL refuses. Each rank copies and reduces with tensor ops on its own stream, ordered after
// the caller's current stream by an event; a call returns once its results are complete on the
// device (the host waits), so later work on any stream sees them. For tests, not for speed.
//
//   threads::run_ranks(4, [](ProcessGroup& pg) {
//     Tensor t = from_vector<float>({float(pg.rank())});
//     pg.all_reduce(t);                       // t == {0 + 1 + 2 + 3}
//   });
//
// Thread-safety: each rank's ProcessGroup is used by that rank's thread(s) like any group.

#include <functional>
#include <memory>
#include <vector>

#include "tessel/collectives/process_group.h"

namespace tessel::threads {

// The groups of a new world of `size` ranks (element r is rank r's). Cheap; no threads start.
// Throws InvalidArgument when size < 1.
std::vector<std::shared_ptr<ProcessGroup>> create_world(int size, ProcessGroupOptions options = {});

// Runs fn(rank's group) on `size` threads, one per rank, and joins them all. When ranks fail,
// the group is aborted (so the others stop waiting) and the first failure is rethrown as the same
// error kind with "rank r: " in front. Blocking; every wait inside is bounded by the group's
// timeout.
void run_ranks(int size, const std::function<void(ProcessGroup&)>& fn,
               ProcessGroupOptions options = {});

}  // namespace tessel::threads
