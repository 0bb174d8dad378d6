#pragma once
// Helpers for the attention tests: random (B, H, S, D) buffers, views over them, and error
// measures.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/tensor/dtype.h"

namespace tessel::kernels::attention::testing {

// A contiguous (B, H, S, D) buffer in f32 or bf16 (bf16 kept as raw bits).
struct Buffer {
  DType dtype = DType::kF32;
  int64_t sizes[4] = {0, 0, 0, 0};
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Buffer(DType dt, int64_t b, int64_t h, int64_t s, int64_t d) : dtype(dt), sizes{b, h, s, d} {
    const auto n = static_cast<size_t>(b * h * s * d);
    if (dt == DType::kF32) f32.assign(n, 0.0f); else bf16.assign(n, 0);
  }
  int64_t numel() const { return sizes[0] * sizes[1] * sizes[2] * sizes[3]; }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  AttentionView view() { return attention_view(data(), dtype, sizes); }
  float at(int64_t i) const {
    if (dtype == DType::kF32) return f32[i];
    BFloat16 x;
    x.bits = bf16[i];
    return static_cast<float>(x);
  }
  void set(int64_t i, float x) {
    if (dtype == DType::kF32) f32[i] = x; else bf16[i] = BFloat16::from_float(x);
  }
  std::vector<float> values() const {
    std::vector<float> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = at(i);
    return out;
  }
};

inline void fill_normal(Buffer& buf, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < buf.numel(); ++i) buf.set(i, dist(gen));
}

// Random q (B, H_q, S_q, D), k and v (B, H_kv, S_k, D) and an output gradient like q.
struct Qkv {
  Buffer q, k, v, dout;
  Qkv(DType dt, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
      uint32_t seed)
      : q(dt, b, hq, sq, d), k(dt, b, hkv, sk, d), v(dt, b, hkv, sk, d), dout(dt, b, hq, sq, d) {
    fill_normal(q, seed);
    fill_normal(k, seed + 1);
    fill_normal(v, seed + 2);
    fill_normal(dout, seed + 3);
  }
  // An unmasked problem over q, k, v.
  AttentionProblem problem() {
    AttentionProblem p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    return p;
  }
};

// max_i |a_i - b_i|; NaN anywhere counts as infinite error.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}
inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

}  // namespace tessel::kernels::attention::testing
