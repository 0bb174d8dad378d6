#pragma once
// Device copies of a MaskPlan's arrays (tile map, predicate bits, prefix lengths, document ids)
// for one call, in memory from the device's caching allocator. CUDA builds only.

#include <cuda_runtime_api.h>

#include <vector>

#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"
#include "tessel/tensor/tensor.h"

namespace tessel::kernels::attention::cuda {

// Copies the arrays on `stream` (through a small ring of pinned staging buffers, so the copy
// does not wait for the stream's earlier work) and keeps them until destroyed; destroying it
// right after the kernels are issued on the same stream is safe (the allocator reuses memory in
// stream order). Not thread-safe per object; the staging ring is shared and locked.
class DeviceMask {
 public:
  DeviceMask(const MaskPlan& plan, Device device, cudaStream_t stream);

  // plan.params pointing at the device copies.
  const MaskParams& params() const { return params_; }

 private:
  MaskParams params_;
  std::vector<Tensor> arrays_;
};

}  // namespace tessel::kernels::attention::cuda
