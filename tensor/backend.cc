#include "tessel/tensor/backend.h"

#include <array>
#include <atomic>

#include "tessel/base/error.h"
#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/internal/meta_backend.h"

namespace tessel {
namespace {
std::array<std::atomic<Backend*>, kDeviceTypeCount> g_backends = {
    &cpu::cpu_backend(), nullptr, &internal::meta_backend()};
}  // namespace

Backend& backend_for(Device device) {
  Backend* b = g_backends[static_cast<size_t>(device.type)].load(std::memory_order_acquire);
  TESSEL_CHECK(b != nullptr, Unavailable,
               "no tensor backend for device {}: this build of tessel has no kernels for it",
               device.str());
  return *b;
}

void register_backend(DeviceType type, Backend* backend) {
  g_backends[static_cast<size_t>(type)].store(backend, std::memory_order_release);
}

}  // namespace tessel
