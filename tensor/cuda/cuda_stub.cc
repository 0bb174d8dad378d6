// The CUDA backend in a build without CUDA: nothing to register, no devices.
#include <atomic>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/cuda/cuda_builtin.h"

namespace tessel::cuda {
namespace {
std::atomic<bool> g_allow_tf32{false};
}  // namespace

Backend* builtin_backend() { return nullptr; }
DeviceRuntime* builtin_runtime() { return nullptr; }
Allocator* builtin_allocator() { return nullptr; }
Allocator* builtin_pinned_allocator() { return nullptr; }

bool is_built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() {
  return "this build of tessel has no CUDA backend (configured with TESSEL_WITH_CUDA=OFF or "
         "without nvcc)";
}
std::string device_name(int index) {
  throw Unavailable(
      fmt::format("device cuda:{} is not available: {}", index, unavailable_reason()));
}
void set_device(int index) {
  throw Unavailable(
      fmt::format("device cuda:{} is not available: {}", index, unavailable_reason()));
}
void set_matmul_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool matmul_allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

}  // namespace tessel::cuda
