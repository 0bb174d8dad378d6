// AVX-512 BF16 tile kernels: vdpbf16ps GEMMs over bf16 pairs with f32 accumulation (compiled with
// -mavx512f -mavx512bf16 ...; used only where the CPU reports avx512bf16).
#include <immintrin.h>

#define TESSEL_TILE_ISA avx512bf16
#include "tessel/kernels/attention/cpu/internal/tile_ops_impl.h"
#include "tessel/kernels/attention/cpu/internal/vec_avx512.h"

namespace tessel::kernels::attention::internal {
namespace avx512bf16 {
namespace {

struct PairVec {
  using Reg = __m512;
  using Elem = uint32_t;  // two bf16
  static constexpr int kWidth = 16;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg load_b(const uint32_t* p) { return _mm512_castsi512_ps(_mm512_loadu_si512(p)); }
  static Reg broadcast_a(const uint32_t* p) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(*p)));
  }
  // acc + a.x * b.x + a.y * b.y per lane.
  static Reg madd(Reg a, Reg b, Reg acc) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
};

__m256i bf16_bits(const float* src) {
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(src)));
}

void to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_bits(src + i));
  }
}

void to_bf16_pairs(const float* lo, const float* hi, uint32_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __m512i pairs = _mm512_cvtepu16_epi32(bf16_bits(lo + i));
    if (hi)
      pairs =
          _mm512_or_si512(pairs, _mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits(hi + i)), 16));
    _mm512_storeu_si512(dst + i, pairs);
  }
}

// (bf16(lo[i]), bf16(hi[i])) for the 16 lanes: both rounded by one vcvtne2ps2bf16, then
// interleaved.
__m512i bf16_pairs(__m512 lo, __m512 hi) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i halves = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  return _mm512_permutexvar_epi16(interleave, halves);
}

// See Bf16TileOps::pair_rows_blocked.
void pair_rows_blocked(const float* src, int64_t rows, int64_t n, uint32_t* dst) {
  const int64_t block = rows / 2 * 16;
  for (int64_t t = 0; t < rows / 2; ++t) {
    const float* lo = src + 2 * t * n;
    for (int64_t j = 0; j < n; j += 16) {
      _mm512_storeu_si512(dst + j / 16 * block + t * 16,
                          bf16_pairs(_mm512_loadu_ps(lo + j), _mm512_loadu_ps(lo + n + j)));
    }
  }
}

// 2^x for x <= 64 to 2.7e-6 relative (about 22 f32 ulps, like PyTorch's exp_u20), exactly 0 for
// x < -126 and -inf: for probabilities that are rounded to bf16 (3.9e-3) right after. Cheaper
// than Vec512::exp2: a degree-4 polynomial in f = x - floor(x) (least squares on the relative
// error at 400 Chebyshev nodes of [0, 1]).
__m512 exp2_bf16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF);  // x - floor(x), exactly
  __m512 p = _mm512_set1_ps(0.0135206031f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0520374291f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.241427496f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693006635f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000025f));
  return _mm512_maskz_scalef_ps(live, p, x);  // times 2^floor(x)
}

// See Bf16TileOps::softmax_pairs; the arithmetic of softmax_step<Vec512> with n = 16, but the
// exponentials by exp2_bf16.
void softmax_pairs(const float* st, int64_t keys, float mul, const float* keep, float* m, float* l,
                   float* ot, int64_t out_rows, float* alpha, uint32_t* pt, int64_t pairs) {
  using V = Vec512;
  const __m512 vmul = V::set1(mul);
  const __m512 m_old = V::load(m);
  const __m512 m_tile = V::mul(column_max<V>(st, keys, 16), vmul);
  // The maxima move only past the slack (see softmax_step).
  const bool moves = V::any_greater(m_tile, V::add(m_old, V::set1(kRescaleSlack)));
  const __m512 m_new = moves ? V::max(m_old, m_tile) : m_old;
  // A query that sees no key yet keeps exponentials (and alpha) at 0 rather than NaN.
  const __m512 sub = V::max(m_new, V::set1(-__FLT_MAX__));
  const __m512 a = moves ? V::exp2(V::sub(m_old, sub)) : V::set1(1.0f);
  __m512 sum = V::zero();
  int64_t t = 0;
  for (; 2 * t < keys; ++t) {
    __m512 e0 = exp2_bf16(V::fmsub(V::load(st + 2 * t * 16), vmul, sub));
    __m512 e1 = 2 * t + 1 < keys ? exp2_bf16(V::fmsub(V::load(st + (2 * t + 1) * 16), vmul, sub))
                                 : V::zero();
    sum = V::add(sum, V::add(e0, e1));
    if (keep) {
      e0 = V::mul(e0, V::load(keep + 2 * t * 16));
      if (2 * t + 1 < keys) e1 = V::mul(e1, V::load(keep + (2 * t + 1) * 16));
    }
    _mm512_storeu_si512(pt + t * 16, bf16_pairs(e0, e1));
  }
  for (; t < pairs; ++t) _mm512_storeu_si512(pt + t * 16, _mm512_setzero_si512());
  V::store(l, V::fmadd(V::load(l), a, sum));
  V::store(m, m_new);
  V::store(alpha, a);
  if (!moves) return;  // the common case once the maxima settle
  for (int64_t c = 0; c < out_rows; ++c) V::store(ot + c * 16, V::mul(V::load(ot + c * 16), a));
}

}  // namespace
}  // namespace avx512bf16

const Bf16TileOps& tile_ops_avx512_bf16() {
  static const Bf16TileOps ops{&avx512bf16::gemm<avx512bf16::PairVec, 6, 4>, &avx512bf16::to_bf16,
                               &avx512bf16::to_bf16_pairs, &avx512bf16::pair_rows_blocked,
                               &avx512bf16::softmax_pairs};
  return ops;
}

}  // namespace tessel::kernels::attention::internal
