#pragma once
// CUDA runtime calls checked at the call site: a failed call throws a tessel error naming the
// call's text and CUDA's message. Also a guard that makes a device current for a scope.
//
//   TESSEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));

#include <cuda_runtime_api.h>

namespace tessel::kernels::attention::cuda {

// Throws unless rc is cudaSuccess: OutOfMemory for allocation failures, Unavailable when there
// is no usable device or driver, Internal otherwise (a launch failure is a bug). `call` is the
// call's source text.
void check_cuda(cudaError_t rc, const char* call);

// Makes `device` current on this thread for its lifetime, then restores the previous device.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace tessel::kernels::attention::cuda

#define TESSEL_CUDA_CHECK(call) ::tessel::kernels::attention::cuda::check_cuda((call), #call)
