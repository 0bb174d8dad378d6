#pragma once
// Row access to (B, H, S, D) attention views: load a row into a float/double buffer and store
// one back, converting f32/bf16/f16 and honouring any stride. Private to kernels/attention.

#include <cstdint>
#include <cstring>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/tensor/dtype.h"

namespace tessel::kernels::attention::internal {

// dst[0..D) = view[b, h, s, :] (as Acc).
template <typename Acc>
inline void load_row(const AttentionView& v, int64_t b, int64_t h, int64_t s, Acc* dst) {
  const int64_t n = v.head_dim(), ds = v.strides[3];
  const int64_t base = v.offset(b, h, s, 0);
  if (v.dtype == DType::kF32) {
    const float* src = static_cast<const float*>(v.data) + base;
    if (ds == 1 && sizeof(Acc) == sizeof(float)) {
      std::memcpy(dst, src, n * sizeof(float));
      return;
    }
    for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<Acc>(src[d * ds]);
  } else if (v.dtype == DType::kF16) {
    const uint16_t* src = static_cast<const uint16_t*>(v.data) + base;
    for (int64_t d = 0; d < n; ++d) {
      Half h;
      h.bits = src[d * ds];
      dst[d] = static_cast<Acc>(static_cast<float>(h));
    }
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(v.data) + base;
    for (int64_t d = 0; d < n; ++d) {
      const uint32_t bits = uint32_t{src[d * ds]} << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      dst[d] = static_cast<Acc>(f);
    }
  }
}

// view[b, h, s, :] = src[0..D) * scale, rounded to the view's dtype.
template <typename Acc>
inline void store_row(const AttentionView& v, int64_t b, int64_t h, int64_t s, const Acc* src,
                      Acc scale = Acc(1)) {
  const int64_t n = v.head_dim(), ds = v.strides[3];
  const int64_t base = v.offset(b, h, s, 0);
  if (v.dtype == DType::kF32) {
    float* dst = static_cast<float*>(v.data) + base;
    for (int64_t d = 0; d < n; ++d) dst[d * ds] = static_cast<float>(src[d] * scale);
  } else if (v.dtype == DType::kF16) {
    uint16_t* dst = static_cast<uint16_t*>(v.data) + base;
    for (int64_t d = 0; d < n; ++d) dst[d * ds] = Half(static_cast<float>(src[d] * scale)).bits;
  } else {
    uint16_t* dst = static_cast<uint16_t*>(v.data) + base;
    for (int64_t d = 0; d < n; ++d) {
      dst[d * ds] = BFloat16::from_float(static_cast<float>(src[d] * scale));
    }
  }
}

// Rounds x to bf16 and back (emulates a bf16 intermediate).
inline float round_bf16(float x) { return static_cast<float>(BFloat16(x)); }

}  // namespace tessel::kernels::attention::internal
