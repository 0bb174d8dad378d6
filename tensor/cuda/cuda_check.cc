#include "tessel/tensor/cuda/cuda_check.h"

#include <cuda.h>  // driver types only, for the entry points below (no link against libcuda)

#include <array>
#include <atomic>

#include "tessel/base/build_info.h"
#include "tessel/base/error.h"

namespace tessel::cuda {
namespace {

// The last kRecent kernel names launched on each device (static strings), in a ring. Written
// lock-free by launching threads; read only to build error messages.
constexpr int kRecent = 8;
constexpr int kMaxDevices = 64;
struct RecentLaunches {
  std::atomic<uint32_t> next{0};
  std::array<std::atomic<const char*>, kRecent> names{};
};
RecentLaunches g_recent[kMaxDevices];

bool is_unavailable(cudaError_t s) {
  switch (s) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return true;
    default:
      return false;
  }
}

// Errors of work that ran earlier on the device (the context is unusable afterwards).
bool is_asynchronous(cudaError_t s) {
  switch (s) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorLaunchTimeout:
    case cudaErrorInvalidAddressSpace:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string recent_kernels(int device) {
  if (device < 0 || device >= kMaxDevices) return "unknown";
  RecentLaunches& r = g_recent[device];
  const uint32_t next = r.next.load(std::memory_order_relaxed);
  std::string out;
  for (int i = 1; i <= kRecent; ++i) {
    const char* name = r.names[(next - i) % kRecent].load(std::memory_order_relaxed);
    if (name == nullptr) break;
    out += out.empty() ? name : fmt::format(", {}", name);
  }
  return out.empty() ? "none" : out;
}

void throw_cuda_error(cudaError_t status, const char* call, int device) {
  // Clears a non-sticky error so the next call does not report it again.
  if (!is_asynchronous(status)) cudaGetLastError();
  std::string message = fmt::format("{} failed on cuda:{}: {} ({})", call, device,
                                    cudaGetErrorName(status), cudaGetErrorString(status));
  if (is_asynchronous(status)) {
    message += fmt::format(
        "; the error comes from work issued earlier: the kernels launched last on cuda:{} "
        "(newest first) were {}; run with CUDA_LAUNCH_BLOCKING=1 to name the failing one. The "
        "device cannot be used by this process any more",
        device, recent_kernels(device));
  }
  if (status == cudaErrorNoKernelImageForDevice) {
    message += fmt::format(
        "; this build has code for CUDA architectures {} (set "
        "CMAKE_CUDA_ARCHITECTURES to add this device's)",
        build_info().cuda_architectures);
  }
  if (status == cudaErrorMemoryAllocation) throw OutOfMemory(message);
  if (is_unavailable(status)) throw Unavailable(message);
  throw Internal(message);
}

void throw_cublas_error(cublasStatus_t status, const char* call, int device) {
  throw Internal(fmt::format("{} failed on cuda:{}: {} ({})", call, device,
                             cublasLtGetStatusName(status), cublasLtGetStatusString(status)));
}

void check_launch(const char* kernel, int device) {
  if (device >= 0 && device < kMaxDevices) {
    RecentLaunches& r = g_recent[device];
    r.names[r.next.fetch_add(1, std::memory_order_relaxed) % kRecent].store(
        kernel, std::memory_order_relaxed);
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) [[unlikely]] {
    throw_cuda_error(status, fmt::format("launch of kernel {}", kernel).c_str(), device);
  }
}

void throw_invalid_argument(const std::string& message) { throw InvalidArgument(message); }
void throw_internal(const std::string& message) { throw Internal(message); }

int current_device() noexcept {
  int device = -1;
  return cudaGetDevice(&device) == cudaSuccess ? device : -1;
}

bool has_primary_context(int device) noexcept {
#if CUDART_VERSION >= 12050
  using GetDevice = CUresult (*)(CUdevice*, int);
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  struct Entry {
    GetDevice get_device = nullptr;
    GetState get_state = nullptr;
  };
  static const Entry entry = [] {
    Entry e;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      e.get_device = reinterpret_cast<GetDevice>(fn);
    }
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      e.get_state = reinterpret_cast<GetState>(fn);
    }
    return e;
  }();
  if (entry.get_device == nullptr || entry.get_state == nullptr) return true;
  CUdevice handle = 0;
  if (entry.get_device(&handle, device) != CUDA_SUCCESS) return true;
  unsigned int flags = 0;
  int active = 0;
  if (entry.get_state(handle, &flags, &active) != CUDA_SUCCESS) return true;
  return active != 0;
#else
  (void)device;
  return true;
#endif
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice", device);
  if (current != device) {
    const bool restore = has_primary_context(current);
    check_cuda(cudaSetDevice(device), "cudaSetDevice", device);
    if (restore) previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace tessel::cuda
