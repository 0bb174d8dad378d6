#include "tessel/tensor/dtype.h"

#include "tessel/base/error.h"

namespace tessel {

static_assert(sizeof(BFloat16) == 2 && sizeof(Half) == 2 && sizeof(bool) == 1);

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kBool:
      return 1;
  }
  throw Internal(fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI64:
      return "i64";
    case DType::kI32:
      return "i32";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kDTypeCount; ++i) {
    if (dtype_name(static_cast<DType>(i)) == name) return static_cast<DType>(i);
  }
  throw InvalidArgument(
      fmt::format("unknown dtype '{}'; expected f32, bf16, f16, i64, i32 or bool", name));
}

}  // namespace tessel
