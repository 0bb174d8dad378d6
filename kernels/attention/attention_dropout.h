#pragma once
// Counter-based dropout for attention probabilities: tensor/random.h's Philox4x32-10 keyed by the
// seed, with the counter built from (offset, b, h, i, j). Any backend (CPU or GPU) regenerates the
// same mask from the same numbers, which is how backward reproduces forward's dropout without
// storing it.
//
// One Philox call (four 32-bit words) decides four elements, as FlashAttention-2 draws one call
// per several elements: (i, j), (i, j + 8), (i + 8, j), (i + 8, j + 8) for i % 16 < 8 and
// j % 16 < 8 — the four a CUDA thread holds of two adjacent 16 x 8 mma tiles, whether the tile's
// rows are queries (forward, dQ) or keys (the backward's S^T), so every kernel needs one call
// per four elements: (i, j) is word 2 ((i / 8) % 2) + (j / 8) % 2 of
// philox4x32({g(j), g(i), (b << 16) ^ h, offset}, key) with g(x) = 8 (x / 16) + x % 8.

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

  // True when element (b, h, i, j) survives.
  bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    uint32_t r[4];
    block(b, h, i, j, r);
    return r[word(i, j)] >= threshold_;
  }
  // keep() for keys [j0, j0 + n): writes keep_scale() or 0 to out[0..n) (one Philox call per
  // two keys: the row's half of each group).
  void fill(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float* out) const;
  // fill() for queries [i0, i0 + rows), query i0 + r at out + r * ld: one Philox call per four
  // elements where the tile holds whole groups (rows i and i + 8 together).
  void fill_rows(int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t n, float* out,
                 int64_t ld) const;

  // Which word of its group's Philox call decides (i, j).
  static int word(int64_t i, int64_t j) {
    return static_cast<int>(((i >> 3) & 1) * 2 + ((j >> 3) & 1));
  }

 private:
  // The Philox words of the group holding (i, j).
  void block(int64_t b, int64_t h, int64_t i, int64_t j, uint32_t (&r)[4]) const;

  uint32_t threshold_ = 0;  // keep when the uniform 32-bit draw >= p * 2^32
  float keep_scale_ = 1.0f;
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace tessel::kernels::attention
