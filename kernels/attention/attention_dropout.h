#pragma once
// Counter-based dropout for attention probabilities: tensor/random.h's Philox4x32-10 keyed by the
// seed, with the counter built from (offset, b, h, i, j). Any backend (CPU or GPU) regenerates the
// same mask from the same numbers, which is how backward reproduces forward's dropout without
// storing it.

#include <cstdint>

namespace tessel::kernels::attention {

// Decides element (b, h, i, j) for dropout probability p (scaled threshold, see below).
// Thread-safe, stateless.
class DropoutMask {
 public:
  // p in [0, 1); head index h is the query head.
  DropoutMask(double p, uint64_t seed, uint64_t offset);

  bool enabled() const { return threshold_ != 0; }
  // 1 / (1 - p): the factor applied to kept elements.
  float keep_scale() const { return keep_scale_; }

  // True when element (b, h, i, j) survives. One Philox call yields four consecutive j.
  bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    uint32_t r[4];
    block(b, h, i, j >> 2, r);
    return r[j & 3] >= threshold_;
  }
  // keep() for keys [j0, j0 + n): writes keep_scale() or 0 to out[0..n).
  void fill(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* out) const;

 private:
  void block(int64_t b, int64_t h, int64_t i, int64_t j4, uint32_t (&r)[4]) const;

  uint32_t threshold_ = 0;  // keep when the uniform 32-bit draw >= p * 2^32
  float keep_scale_ = 1.0f;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace tessel::kernels::attention
