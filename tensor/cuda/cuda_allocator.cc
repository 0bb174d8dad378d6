// Device memory and page-locked host memory for the caching allocator (caching_allocator.h):
// cudaMalloc/cudaFree and cudaHostAlloc/cudaFreeHost, with CUDA events for the stream rule.
#include "tessel/base/error.h"
#include "tessel/tensor/cuda/caching_allocator.h"
#include "tessel/tensor/cuda/cuda_builtin.h"
#include "tessel/tensor/cuda/cuda_runtime.h"

namespace tessel::cuda {
namespace {

// Events shared by both kinds of memory: taken from the runtime's pool, recorded on a CUDA
// stream, queried, given back.
void* record_cuda_event(const Stream& stream) {
  const int d = stream.device().index;
  TESSEL_CHECK(stream.device().is_cuda(), InvalidArgument,
               "CUDA memory can be marked as used by CUDA streams only, not {}", stream.str());
  void* event = cuda_runtime().create_event(d, /*timing=*/false);
  DeviceGuard guard(d);
  const cudaError_t status = cudaEventRecord(static_cast<cudaEvent_t>(event),
                                             static_cast<cudaStream_t>(stream.native_handle()));
  if (status != cudaSuccess) {
    cuda_runtime().destroy_event(event);
    throw_cuda_error(status, "cudaEventRecord", d);
  }
  return event;
}

bool cuda_event_complete(void* event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) return false;
  int d = 0;
  cudaGetDevice(&d);
  check_cuda(status, "cudaEventQuery", d);
  return true;
}

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device) : device_(device) {}

  void* allocate(size_t bytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    const cudaError_t status = cudaMalloc(&ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it
      return nullptr;
    }
    check_cuda(status, "cudaMalloc", device_);
    return ptr;
  }
  void free(void* ptr) noexcept override {
    try {
      DeviceGuard guard(device_);
      cudaFree(ptr);
    } catch (const Error&) {
      // A device that cannot be made current (a dead context) has nothing left to free.
    }
  }
  void* record_event(const Stream& stream) override { return record_cuda_event(stream); }
  bool event_complete(void* event) override { return cuda_event_complete(event); }
  void destroy_event(void* event) noexcept override { cuda_runtime().destroy_event(event); }
  std::string describe() override {
    DeviceGuard guard(device_);
    size_t free_bytes = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo", device_);
    return fmt::format("cuda:{} has {} free of {}", device_,
                       bytes_str(static_cast<int64_t>(free_bytes)),
                       bytes_str(static_cast<int64_t>(total)));
  }

 private:
  int device_;
};

class PinnedHostMemory final : public DeviceMemory {
 public:
  void* allocate(size_t bytes) override {
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    check_cuda(status, "cudaHostAlloc", 0);
    return ptr;
  }
  void free(void* ptr) noexcept override { cudaFreeHost(ptr); }
  void* record_event(const Stream& stream) override { return record_cuda_event(stream); }
  bool event_complete(void* event) override { return cuda_event_complete(event); }
  void destroy_event(void* event) noexcept override { cuda_runtime().destroy_event(event); }
  std::string describe() override { return "page-locked host memory (cudaHostAlloc)"; }
};

}  // namespace

Allocator* builtin_allocator() {
  static CachingAllocator* allocator =
      new CachingAllocator(DeviceType::kCUDA, "CUDA",
                           [](int device) { return std::make_unique<CudaDeviceMemory>(device); });
  return allocator;
}

Allocator* builtin_pinned_allocator() {
  if (cuda_runtime().device_count() == 0) return nullptr;
  static CachingAllocator* allocator = new CachingAllocator(
      DeviceType::kCPU, "pinned host", [](int) { return std::make_unique<PinnedHostMemory>(); });
  return allocator;
}

DeviceRuntime* builtin_runtime() { return &cuda_runtime(); }

}  // namespace tessel::cuda
