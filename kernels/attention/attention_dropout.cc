#include "tessel/kernels/attention/attention_dropout.h"

#include <algorithm>
#include <cmath>

#include "tessel/tensor/random.h"

namespace tessel::kernels::attention {
DropoutMask::DropoutMask(double p, uint64_t seed, uint64_t offset) : seed_(seed), offset_(offset) {
  if (p > 0) {
    threshold_ = static_cast<uint32_t>(std::min(std::ldexp(p, 32), 4294967295.0));
    if (threshold_ == 0) threshold_ = 1;
    keep_scale_ = static_cast<float>(1.0 / (1.0 - p));
  }
}

void DropoutMask::block(int64_t b, int64_t h, int64_t i, int64_t j4, uint32_t (&r)[4]) const {
  // Counter words: key group, query row, (batch, head) and the caller's offset; the offset's
  // high half goes into the key so distinct offsets never collide.
  const uint64_t key = seed_ ^ ((offset_ >> 32) * 0x9E3779B97F4A7C15ull);
  const std::array<uint32_t, 4> x =
      philox4x32({static_cast<uint32_t>(j4), static_cast<uint32_t>(i),
                  static_cast<uint32_t>((b << 16) ^ h), static_cast<uint32_t>(offset_)},
                 {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)});
  r[0] = x[0], r[1] = x[1], r[2] = x[2], r[3] = x[3];
}

void DropoutMask::fill(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* out) const {
  int64_t j = j0;
  const int64_t end = j0 + n;
  while (j < end) {
    uint32_t r[4];
    block(b, h, i, j >> 2, r);
    for (int64_t t = j & 3; t < 4 && j < end; ++t, ++j) {
      out[j - j0] = r[t] >= threshold_ ? keep_scale_ : 0.0f;
    }
  }
}

}  // namespace tessel::kernels::attention
