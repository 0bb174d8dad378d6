#pragma once
// Private: f32 transcendental functions written so the compiler vectorises the loops that call
// them: plain arithmetic, bit operations and selects, no libm calls, no branches. They keep the
// IEEE semantics of their std:: counterparts: NaN in gives NaN out, the limits at +-inf, the sign
// of +-0, and exact over/underflow (exp is finite up to 88.7228 and reaches the denormals).
// Accuracy, measured by tests/tensor/special_values_test.cc over random inputs of every
// magnitude: exp 1 ulp, tanh 1 ulp, sigmoid 2 ulp; gelu through fast_normal_cdf 10 ulp for
// |x| <= 4, growing as x^2 / 2 ulp in the lower tail (exp amplifies the rounding of x^2).

#include <bit>
#include <cmath>
#include <cstdint>

namespace tessel::cpu {

[[gnu::always_inline]] inline float fast_exp(float x) {
  // Below -104, exp(x) is under half the smallest denormal; above 89 it overflows. Clamping
  // there keeps every intermediate finite; comparisons written so that NaN passes through.
  x = x > 89.0f ? 89.0f : x;
  x = x < -104.0f ? -104.0f : x;
  // x = n ln2 + r with |r| <= ln2 / 2. Adding 1.5 * 2^23 rounds x / ln2 to the integer n and
  // leaves n in the low mantissa bits, so no float-to-int conversion is needed.
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int32_t ni = static_cast<int32_t>(std::bit_cast<uint32_t>(shifted) - 0x4B400000u);
  // ln2 in two parts; the first has 9 significant bits, so n * part is exact for |n| <= 150.
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // Scale by 2^n as two normal factors 2^(n/2) * 2^(n - n/2): n runs from -150 to 128, past
  // both ends of the normal exponent range, and the product rounds once (into a denormal or
  // to inf when the result is one).
  const int32_t n1 = ni >> 1;
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(ni - n1 + 127) << 23);
  return p * s1 * s2;
}

// 1 / (1 + exp(-x)): 1 at inf, 0 at -inf, denormal for x in [-88.72, -87.34] and 0 below
// (where the true value is under 3e-39), as PyTorch's. Computing e / (1 + e) from e = exp(x)
// for x < 0 would keep those last denormals but cost a third more.
[[gnu::always_inline]] inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

[[gnu::always_inline]] inline float fast_tanh(float x) {
  // Near 0, tanh x = x + x^3 P(x^2), accurate relative to x down to denormals and keeping the
  // sign of -0 (P: Chebyshev fit of (tanh(x) / x - 1) / x^2 on |x| < 0.625, error 4e-8).
  // Elsewhere tanh |x| = (1 - e) / (1 + e) with e = exp(-2|x|), which tends to 1 at inf.
  const float z = x * x;
  float q = -6.096714166e-03f;
  q = q * z + 2.099717900e-02f;
  q = q * z + -5.385090958e-02f;
  q = q * z + 1.333276974e-01f;
  q = q * z + -3.333332894e-01f;
  const float near_zero = x * (1.0f + z * q);
  const float ax = std::fabs(x);
  const float e = fast_exp(-2.0f * ax);
  const float far = std::copysign((1.0f - e) / (1.0f + e), x);
  return ax < 0.625f ? near_zero : far;  // NaN takes `far`, which is NaN
}

// Phi(x) = P(X <= x) for a standard normal X, i.e. (1 + erf(x / sqrt 2)) / 2. With z = |x| /
// sqrt 2, erfc(z) = t G(t) exp(-z^2), t = 1 / (1 + z / 2) in (0, 1], G a Chebyshev fit (relative
// error 3e-7). Phi is erfc(z) / 2 for x < 0 (no cancellation in the lower tail) and
// 1 - erfc(z) / 2 above. z^2 is computed as x^2 / 2 (one rounding): exp amplifies its error.
[[gnu::always_inline]] inline float fast_normal_cdf(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.35355339059327376f * ax);
  float g = -1.857025437e-02f;
  g = g * t + 3.404347849e-02f;
  g = g * t + 8.598342588e-02f;
  g = g * t + -2.523635427e-01f;
  g = g * t + 1.098438108e-01f;
  g = g * t + 4.826816996e-02f;
  g = g * t + 1.822434340e-01f;
  g = g * t + 2.463468137e-01f;
  g = g * t + 2.821098754e-01f;
  g = g * t + 2.820947160e-01f;
  const float half_erfc = 0.5f * t * g * fast_exp(-0.5f * (ax * ax));
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

}  // namespace tessel::cpu
