#include "tessel/tensor/device.h"

#include <charconv>

#include "tessel/base/error.h"

namespace tessel {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    int index = -1;
    const char* begin = text.data() + 5;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(begin, end, index);
    if (ec == std::errc() && ptr == end && index >= 0) return Device::cuda(index);
  }
  throw InvalidArgument(fmt::format("unknown device '{}'; expected cpu, cuda or cuda:N", text));
}

}  // namespace tessel
