#pragma once
// Private: f32 transcendental functions written so the compiler vectorises the loops that call
// them (plain arithmetic, no libm calls, no branches). Accuracy: exp within 2 ulp over
// [-87, 88] (Cephes polynomial); erf within 2e-7 absolute (Abramowitz & Stegun 7.1.26, as in
// PyTorch's vectorised CPU kernels); tanh and sigmoid through exp.

#include <bit>
#include <cstdint>

namespace tessel::cpu {

[[gnu::always_inline]] inline float fast_exp(float x) {
  x = x < 88.3762626647949f ? x : 88.3762626647949f;
  x = x > -87.3365447504f ? x : -87.3365447504f;
  // x = n ln2 + r, |r| <= ln2 / 2; round to nearest with the 1.5 * 2^23 trick (no floor call).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

[[gnu::always_inline]] inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

[[gnu::always_inline]] inline float fast_tanh(float x) {
  // tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|).
  const float ax = x < 0.0f ? -x : x;
  const float e = fast_exp(-2.0f * ax);
  const float t = (1.0f - e) / (1.0f + e);
  return x < 0.0f ? -t : t;
}

[[gnu::always_inline]] inline float fast_erf(float x) {
  constexpr float p = 0.3275911f;
  constexpr float a1 = 0.254829592f, a2 = -0.284496736f, a3 = 1.421413741f, a4 = -1.453152027f,
                  a5 = 1.061405429f;
  const float ax = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + p * ax);
  const float poly = ((((a5 * t + a4) * t + a3) * t + a2) * t + a1) * t;
  const float y = 1.0f - poly * fast_exp(-ax * ax);
  return x < 0.0f ? -y : y;
}

}  // namespace tessel::cpu
