#pragma once
// Private: runs a redistribution plan (redistribute_plan.h) on this rank's local tensor.

#include "tessel/collectives/work.h"
#include "tessel/parallel/dtensor/dtensor_spec.h"

namespace tessel::internal {

struct RedistributeResult {
  Tensor local;  // this rank's piece under `dst` (valid once `work` completes)
  Work work;     // the last step's collective when async_last; completed otherwise
};

// Takes `local` (this rank's piece under `src`) to its piece under `dst` (same mesh, global
// shape and dtype). Steps run in the plan's order on the mesh's groups. Not recorded by autograd.
// With async_last, the last step's collective is issued asynchronously. The input is never
// modified; the result may share memory with it only where no data moved (a local slice).
RedistributeResult run_redistribute(const Tensor& local, const DTensorSpec& src,
                                    const DTensorSpec& dst, bool async_last);

}  // namespace tessel::internal
