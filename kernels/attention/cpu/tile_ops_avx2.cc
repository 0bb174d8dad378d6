// AVX2 + FMA tile kernels (compiled with -mavx2 -mfma).
#include <immintrin.h>

#define TESSEL_TILE_ISA avx2
#include "tessel/kernels/attention/cpu/internal/tile_ops_impl.h"

namespace tessel::kernels::attention::internal {
namespace avx2 {
namespace {

struct Vec {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg fmsub(Reg a, Reg b, Reg c) { return _mm256_fmsub_ps(a, b, c); }
  static float reduce_add(Reg a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(Reg a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static bool any_greater(Reg a, Reg b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)) != 0;
  }
  // 2^x for x <= 64 (see Vec512::exp2): x = n + f with n = floor(x), 2^f by polynomial, 2^n
  // into the exponent bits. Clamping at -127 makes the exponent field 0, so -inf and anything
  // below 2^-126 give exactly 0.
  static Reg exp2(Reg x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-127.0f));
    const Reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const Reg f = _mm256_sub_ps(x, n);
    Reg p = _mm256_set1_ps(kExp2Poly[kExp2Degree]);
    for (int i = kExp2Degree - 1; i >= 0; --i) {
      p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
    }
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
};

}  // namespace
}  // namespace avx2

// 6 rows x 2 vectors: 12 accumulators + 2 B vectors + 1 broadcast of 16 registers.
const TileOps& tile_ops_avx2() { return avx2::make_tile_ops<avx2::Vec, 6, 2>("avx2"); }

}  // namespace tessel::kernels::attention::internal
