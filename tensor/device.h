#pragma once
// Where a tensor's memory lives: the CPU, one CUDA device, or the meta device (shapes and
// dtypes only, no memory: a model can be built there and materialised later).

#include <cstdint>
#include <string>
#include <string_view>

namespace tessel {

enum class DeviceType : uint8_t { kCPU, kCUDA, kMeta };
inline constexpr int kDeviceTypeCount = 3;

// "cpu", "cuda", "meta".
std::string_view device_type_name(DeviceType type);

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU and meta

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  static Device meta() { return {DeviceType::kMeta, 0}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  bool operator==(const Device&) const = default;
  // "cpu", "cuda:0", "meta"
  std::string str() const;
};

// Parses "cpu", "meta", "cuda" or "cuda:N"; throws InvalidArgument otherwise.
Device parse_device(const std::string& text);

// The device that factory functions (empty, zeros, rand, ...) use when none is given: the CPU
// unless a DefaultDeviceGuard on this thread says otherwise.
Device default_device();

// Sets default_device() for its scope on this thread (like `with torch.device(...)`), e.g. to
// build a model on the meta device. Scopes nest; the destructor restores the previous device.
class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(Device device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device previous_;
};

}  // namespace tessel
