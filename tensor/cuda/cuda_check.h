#pragma once
// Private: CUDA and cuBLAS return codes as tessel errors, the current-device guard, and the
// record of recent kernel launches that names the kernels when an asynchronous error surfaces.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

namespace tessel::cuda {

// Throws the tessel error for a failed CUDA call: OutOfMemory for cudaErrorMemoryAllocation,
// Unavailable when there is no usable device or driver (or no code for the device), Internal
// otherwise. The message names the call, the device and CUDA's error name and text; for
// errors of asynchronous work it adds the kernels launched last on that device.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, int device);

inline void check_cuda(cudaError_t status, const char* call, int device) {
  if (status != cudaSuccess) [[unlikely]]
    throw_cuda_error(status, call, device);
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, int device);
inline void check_cublas(cublasStatus_t status, const char* call, int device) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    throw_cublas_error(status, call, device);
}

// After a kernel launch on `device`: remembers `kernel` among the device's recent launches and
// throws, naming it, if the launch failed (bad configuration, no code for the device, or an
// earlier asynchronous error).
void check_launch(const char* kernel, int device);

// "kernel_a, kernel_b, ..." launched last on `device`, newest first ("none" when none).
std::string recent_kernels(int device);

// For code compiled by nvcc, which does not include fmt (its front end cannot evaluate fmt's
// compile-time format checks): throw InvalidArgument / Internal with a ready message.
[[noreturn]] void throw_invalid_argument(const std::string& message);
[[noreturn]] void throw_internal(const std::string& message);

// The device current on this thread (cudaGetDevice; -1 when CUDA cannot say), for checks of
// calls that name no device.
int current_device() noexcept;

// Whether `device` has an active primary context (the driver's cuDevicePrimaryCtxGetState,
// reached through the runtime's entry-point query: no link against libcuda). True when the
// driver cannot say, so callers err on the side of restoring a device.
bool has_primary_context(int device) noexcept;

// Makes `device` current on this thread for a scope and restores the previous device — only
// where that device has a primary context: a thread that never chose a device reports device
// 0, and setting 0 back would create a context on GPU 0 (cudaSetDevice initialises one since
// CUDA 12), hundreds of MiB on a GPU this rank may not use. The one guard of the tensor backend,
// the kernels and the NCCL backend. Cheap when `device` is current already. Throws as
// check_cuda.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace tessel::cuda

// check_cuda for the current device, naming the call by its source text:
//   TESSEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
#define TESSEL_CUDA_CHECK(call)                                           \
  do {                                                                    \
    const cudaError_t tessel_cuda_status_ = (call);                       \
    if (tessel_cuda_status_ != cudaSuccess) [[unlikely]] {                \
      ::tessel::cuda::throw_cuda_error(tessel_cuda_status_, #call,        \
                                       ::tessel::cuda::current_device()); \
    }                                                                     \
  } while (0)
