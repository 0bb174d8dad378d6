#include "tessel/collectives/internal/reduce.h"

#include <algorithm>

#include "tessel/base/error.h"

namespace tessel::internal {
namespace {

template <typename T>
T combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(a + b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kProduct:
      return static_cast<T>(a * b);
  }
  return a;
}

template <typename T>
void pair_typed(ReduceOp op, T* out, const T* a, const T* b, int64_t n) {
  // One switch per call, not per element, so the loops vectorise.
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] + b[i]);
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] * b[i]);
      return;
  }
}

template <typename F>  // BFloat16 or Half
void pair_16(ReduceOp op, F* out, const F* a, const F* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = F(combine<float>(op, static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

void pair_bool(ReduceOp op, uint8_t* out, const uint8_t* a, const uint8_t* b, int64_t n) {
  const bool any = op == ReduceOp::kSum || op == ReduceOp::kAvg || op == ReduceOp::kMax;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = any ? static_cast<uint8_t>(a[i] || b[i]) : static_cast<uint8_t>(a[i] && b[i]);
  }
}

}  // namespace

void reduce_pair(DType dtype, ReduceOp op, void* out, const void* a, const void* b, int64_t count) {
  switch (dtype) {
    case DType::kF32:
      return pair_typed(op, static_cast<float*>(out), static_cast<const float*>(a),
                        static_cast<const float*>(b), count);
    case DType::kI64:
      return pair_typed(op, static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                        static_cast<const int64_t*>(b), count);
    case DType::kI32:
      return pair_typed(op, static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                        static_cast<const int32_t*>(b), count);
    case DType::kBF16:
      return pair_16(op, static_cast<BFloat16*>(out), static_cast<const BFloat16*>(a),
                     static_cast<const BFloat16*>(b), count);
    case DType::kF16:
      return pair_16(op, static_cast<Half*>(out), static_cast<const Half*>(a),
                     static_cast<const Half*>(b), count);
    case DType::kBool:
      return pair_bool(op, static_cast<uint8_t*>(out), static_cast<const uint8_t*>(a),
                       static_cast<const uint8_t*>(b), count);
  }
  throw Internal(fmt::format("reduce_pair: unhandled dtype {}", static_cast<int>(dtype)));
}

void reduce_into(DType dtype, ReduceOp op, void* acc, const void* src, int64_t count) {
  reduce_pair(dtype, op, acc, acc, src, count);
}

void divide_by(DType dtype, void* data, int64_t count, int64_t divisor) {
  TESSEL_CHECK(divisor > 0, InvalidArgument, "divide_by: divisor {} must be positive", divisor);
  switch (dtype) {
    case DType::kF32: {
      auto* p = static_cast<float*>(data);
      const float d = static_cast<float>(divisor);
      for (int64_t i = 0; i < count; ++i) p[i] /= d;
      return;
    }
    case DType::kI64: {
      auto* p = static_cast<int64_t*>(data);
      for (int64_t i = 0; i < count; ++i) p[i] /= divisor;
      return;
    }
    case DType::kI32: {
      auto* p = static_cast<int32_t*>(data);
      for (int64_t i = 0; i < count; ++i) p[i] = static_cast<int32_t>(p[i] / divisor);
      return;
    }
    case DType::kBF16: {
      auto* p = static_cast<BFloat16*>(data);
      for (int64_t i = 0; i < count; ++i) {
        p[i] = BFloat16(static_cast<float>(p[i]) / static_cast<float>(divisor));
      }
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<Half*>(data);
      for (int64_t i = 0; i < count; ++i) {
        p[i] = Half(static_cast<float>(p[i]) / static_cast<float>(divisor));
      }
      return;
    }
    case DType::kBool:
      return;
  }
}

}  // namespace tessel::internal
