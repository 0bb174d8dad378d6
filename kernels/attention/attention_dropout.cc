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

void DropoutMask::block(int64_t b, int64_t h, int64_t i, int64_t j, uint32_t (&r)[4]) const {
  // Counter words: key group, query group, (batch, head) and the caller's offset; the offset's
  // high half goes into the key so distinct offsets never collide.
  const uint64_t key = seed_ ^ ((offset_ >> 32) * 0x9E3779B97F4A7C15ull);
  const auto group = [](int64_t x) { return static_cast<uint32_t>((x >> 4) * 8 + (x & 7)); };
  const std::array<uint32_t, 4> x = philox4x32(
      {group(j), group(i), static_cast<uint32_t>((b << 16) ^ h), static_cast<uint32_t>(offset_)},
      {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)});
  r[0] = x[0], r[1] = x[1], r[2] = x[2], r[3] = x[3];
}

void DropoutMask::fill(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* out) const {
  fill_rows(b, h, i, 1, j0, n, out, n);
}

void DropoutMask::fill_rows(int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t n,
                            float* out, int64_t ld) const {
  const int64_t i_end = i0 + rows, j_end = j0 + n;
  auto decide = [&](uint32_t r) { return r >= threshold_ ? keep_scale_ : 0.0f; };
  for (int64_t i = i0; i < i_end; ++i) {
    // Rows i and i + 8 (i % 16 < 8) share each call: both are filled at the first in range.
    if ((i & 8) != 0 && i - 8 >= i0) continue;
    const bool pair = (i & 8) == 0 && i + 8 < i_end;
    float* row = out + (i - i0) * ld;
    float* row8 = pair ? row + 8 * ld : nullptr;
    const int w = static_cast<int>((i >> 3) & 1) * 2;  // the words of row i
    for (int64_t j = j0; j < j_end; ++j) {
      // Keys j and j + 8 (j % 16 < 8) likewise.
      if ((j & 8) != 0 && j - 8 >= j0) continue;
      uint32_t r[4];
      block(b, h, i, j, r);
      const int c = static_cast<int>((j >> 3) & 1);
      const bool pair_j = (j & 8) == 0 && j + 8 < j_end;
      row[j - j0] = decide(r[w + c]);
      if (pair_j) row[j + 8 - j0] = decide(r[w + 1]);
      if (pair) {
        row8[j - j0] = decide(r[2 + c]);
        if (pair_j) row8[j + 8 - j0] = decide(r[3]);
      }
    }
  }
}

}  // namespace tessel::kernels::attention
