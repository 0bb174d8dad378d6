#pragma once
// The AVX-512 vector type (Vec512) that tile_ops_impl.h's templates take, for the kernel files
// compiled with AVX-512 flags: include it after tile_ops_impl.h, with TESSEL_TILE_ISA defined.

#include <immintrin.h>

#include <cstdint>

namespace tessel::kernels::attention::internal::TESSEL_TILE_ISA {
namespace {

struct Vec512 {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg fmsub(Reg a, Reg b, Reg c) { return _mm512_fmsub_ps(a, b, c); }
  static float reduce_add(Reg a) { return _mm512_reduce_add_ps(a); }
  static float reduce_max(Reg a) { return _mm512_reduce_max_ps(a); }
  static bool any_greater(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ) != 0; }
  // 2^x for x <= 64 (the softmax exponentiates differences from a running maximum, at most
  // kRescaleSlack above it): 2^f for f = x - floor(x) in [0, 1] (one vreduceps) by
  // polynomial, times 2^floor(x) by vscalefps on x. Lanes with x < -126 (-inf included) give
  // exactly 0, so masked scores and results below 2^-126 vanish.
  static Reg exp2(Reg x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    const Reg f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF);  // x - floor(x), exactly
    Reg p = _mm512_set1_ps(kExp2Poly[kExp2Degree]);
    for (int i = kExp2Degree - 1; i >= 0; --i) {
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
    }
    return _mm512_maskz_scalef_ps(live, p, x);
  }
  // dst[c * ld_dst + r] = src[r * ld_src + c] * (scale ? scale[c] : 1) for a 16 x 16 block:
  // unpack pairs, then quads, then 128-bit lanes twice.
  static void transpose_block(const float* src, int64_t ld_src, float* dst, int64_t ld_dst,
                              const float* scale) {
    Reg r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld_src);
    if (scale) {
      const Reg s = _mm512_loadu_ps(scale);
      for (int i = 0; i < 16; ++i) r[i] = _mm512_mul_ps(r[i], s);
    }
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      for (int k = 0; k < 2; ++k) {
        const __m512d a = _mm512_castps_pd(t[i + k]), b = _mm512_castps_pd(t[i + k + 2]);
        r[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
      }
    }
    for (int i = 0; i < 16; i += 8) {
      for (int k = 0; k < 4; ++k) {
        t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0x88);
        t[i + k + 4] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0xdd);
      }
    }
    for (int k = 0; k < 8; ++k) {
      r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
      r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ld_dst, r[i]);
  }
};

}  // namespace
}  // namespace tessel::kernels::attention::internal::TESSEL_TILE_ISA
