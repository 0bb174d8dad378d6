#include "tessel/tensor/device.h"

#include <charconv>

#include "tessel/base/error.h"

namespace tessel {
namespace {
thread_local Device t_default_device = Device::cpu();
}  // namespace

std::string_view device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return "cuda";
    case DeviceType::kMeta:
      return "meta";
  }
  return "unknown";
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return fmt::format("cuda:{}", index);
    case DeviceType::kMeta:
      return "meta";
  }
  return "unknown";
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "meta") return Device::meta();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    int index = -1;
    const char* begin = text.data() + 5;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(begin, end, index);
    if (ec == std::errc() && ptr == end && index >= 0) return Device::cuda(index);
  }
  throw InvalidArgument(
      fmt::format("unknown device '{}'; expected cpu, meta, cuda or cuda:N", text));
}

Device default_device() { return t_default_device; }

DefaultDeviceGuard::DefaultDeviceGuard(Device device) : previous_(t_default_device) {
  t_default_device = device;
}
DefaultDeviceGuard::~DefaultDeviceGuard() { t_default_device = previous_; }

}  // namespace tessel
