#pragma once
// Element types of tensors (f32, bf16, f16, i64, i32, bool) and the 16-bit float formats.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessel {

enum class DType : uint8_t { kF32, kBF16, kF16, kI64, kI32, kBool };

inline constexpr int kDTypeCount = 6;

size_t dtype_size(DType dtype);            // bytes per element
std::string_view dtype_name(DType dtype);  // "f32", "bf16", "f16", "i64", "i32", "bool"
bool is_floating(DType dtype);             // f32, bf16, f16
// The dtype named `name` (as dtype_name prints it); throws InvalidArgument listing valid names.
DType dtype_from_name(std::string_view name);

// bfloat16: the upper 16 bits of an IEEE f32. Conversion from f32 rounds to nearest even.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return std::bit_cast<float>(uint32_t{bits} << 16); }

  static uint16_t from_float(float value) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

// IEEE half precision, using the compiler's _Float16 for correctly rounded conversion.
struct Half {
  uint16_t bits = 0;

  Half() = default;
  explicit Half(float value) : bits(std::bit_cast<uint16_t>(static_cast<_Float16>(value))) {}
  explicit operator float() const { return static_cast<float>(std::bit_cast<_Float16>(bits)); }
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

// dtype_of<float>() == DType::kF32, for the six element types above.
template <typename T>
constexpr DType dtype_of() {
  return DTypeOf<T>::value;
}

}  // namespace tessel
