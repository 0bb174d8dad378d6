#pragma once
// Where a tensor's memory lives: the CPU or one CUDA device.

#include <cstdint>
#include <string>

namespace tessel {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  // "cpu", "cuda:0"
  std::string str() const;
};

// Parses "cpu", "cuda" or "cuda:N"; throws InvalidArgument otherwise.
Device parse_device(const std::string& text);

}  // namespace tessel
