#include "tessel/kernels/attention/cuda/cuda_check.h"

#include <fmt/format.h>

#include "tessel/base/error.h"

namespace tessel::kernels::attention::cuda {

void check_cuda(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) [[likely]] return;
  const std::string message =
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(rc), cudaGetErrorName(rc));
  switch (rc) {
    case cudaErrorMemoryAllocation: throw OutOfMemory(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion: throw Unavailable(message);
    default: throw Internal(message);
  }
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  TESSEL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) TESSEL_CUDA_CHECK(cudaSetDevice(device));
}

CudaDeviceGuard::~CudaDeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

}  // namespace tessel::kernels::attention::cuda
