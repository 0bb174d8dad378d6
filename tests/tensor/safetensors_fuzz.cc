// libFuzzer entry point for the safetensors parser: any input must parse or throw a
// tessel::Error, never crash or read out of bounds (built with ASan/UBSan by
// scripts/fuzz_safetensors.sh, which runs it for a bounded time).

#include <cstddef>
#include <cstdint>
#include <span>

#include "tessel/base/error.h"
#include "tessel/tensor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tessel::parse_safetensors(std::span(reinterpret_cast<const std::byte*>(data), size), "<fuzz>");
  } catch (const tessel::Error&) {
    // Rejecting malformed input is the expected outcome.
  }
  return 0;
}
