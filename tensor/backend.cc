#include "tessel/tensor/backend.h"

#include <array>
#include <atomic>

#include "tessel/base/error.h"
#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cuda/cuda_builtin.h"
#include "tessel/tensor/internal/builtin_slot.h"
#include "tessel/tensor/internal/meta_backend.h"

namespace tessel {
namespace {
std::array<std::atomic<Backend*>, kDeviceTypeCount> g_backends = {&cpu::cpu_backend(), nullptr,
                                                                  &internal::meta_backend()};

// The registered backend of `type`; CUDA's is taken from the CUDA backend on first use (null
// in a build without it).
Backend* backend_slot(DeviceType type) {
  std::atomic<Backend*>& slot = g_backends[static_cast<size_t>(type)];
  if (type != DeviceType::kCUDA) return slot.load(std::memory_order_acquire);
  return internal::slot_or_builtin(slot, &cuda::builtin_backend);
}
}  // namespace

Backend& backend_for(Device device) {
  Backend* b = backend_slot(device.type);
  TESSEL_CHECK(b != nullptr, Unavailable,
               "no tensor backend for device {}: this build of tessel has no kernels for it",
               device.str());
  return *b;
}

void register_backend(DeviceType type, Backend* backend) {
  g_backends[static_cast<size_t>(type)].store(backend, std::memory_order_release);
}

}  // namespace tessel
