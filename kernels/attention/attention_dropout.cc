#include "tessel/kernels/attention/attention_dropout.h"

#include <cmath>

namespace tessel::attention {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t{a} * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

}  // namespace

Philox4x32::Philox4x32(const uint32_t (&counter)[4], uint64_t key) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c0, hi0, lo0);
    mulhilo(kPhiloxM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

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
  const uint32_t counter[4] = {static_cast<uint32_t>(j4), static_cast<uint32_t>(i),
                               static_cast<uint32_t>((b << 16) ^ h),
                               static_cast<uint32_t>(offset_)};
  const Philox4x32 x(counter, seed_ ^ ((offset_ >> 32) * 0x9E3779B97F4A7C15ull));
  r[0] = x.out[0], r[1] = x.out[1], r[2] = x.out[2], r[3] = x.out[3];
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

}  // namespace tessel::attention
