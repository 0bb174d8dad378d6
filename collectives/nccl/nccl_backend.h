#pragma once
// The NCCL backend: CUDA tensors, one communicator per group on a dedicated stream. The unique id
// travels through the job's Store; split() is ncclCommSplit. Communicators are non-blocking
// (ncclCommInitRankConfig with blocking = 0): every call polls ncclCommGetAsyncError and the
// stream until done or until its timeout, after which the communicator is aborted
// (ncclCommAbort) and the call fails with Timeout; a remote failure gives CommError.
// CUDA and NCCL headers stay in nccl_backend.cc. A build without NCCL compiles a stub:
// nccl_is_available() is false and the factory throws Unavailable.

#include <memory>

#include "tessel/collectives/process_group.h"
#include "tessel/store/store.h"

namespace tessel {

struct NcclOptions {
  int device = -1;  // CUDA device of this rank; -1: local_rank modulo the device count
  // This rank's index among its node's, as the launcher says (init_process_group passes
  // LOCAL_RANK); -1: not known, the rank stands in.
  int local_rank = -1;
  ProcessGroupOptions group = {};
};

namespace nccl {

// True when this build has NCCL and at least one CUDA device is visible.
bool is_available();

// Creates the communicator of `size` ranks (collective: every rank calls it with the same
// store). Rank 0 publishes the unique id under "nccl/<group id>/id". Throws Unavailable,
// Timeout, CommError (with NCCL's or CUDA's error text).
std::shared_ptr<ProcessGroup> create_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                   NcclOptions options = {});

}  // namespace nccl

}  // namespace tessel
