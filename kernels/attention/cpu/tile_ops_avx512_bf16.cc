// AVX-512 BF16 tile kernels: vdpbf16ps GEMMs over bf16 pairs with f32 accumulation (compiled with
// -mavx512f -mavx512bf16 ...; used only where the CPU reports avx512bf16).
#include <immintrin.h>

#define TESSEL_TILE_ISA avx512bf16
#include "tessel/kernels/attention/cpu/internal/tile_ops_impl.h"

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
    if (hi) pairs = _mm512_or_si512(pairs, _mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits(hi + i)), 16));
    _mm512_storeu_si512(dst + i, pairs);
  }
}

}  // namespace
}  // namespace avx512bf16

const Bf16TileOps& tile_ops_avx512_bf16() {
  static const Bf16TileOps ops{&avx512bf16::gemm<avx512bf16::PairVec, 6, 4>,
                               &avx512bf16::to_bf16, &avx512bf16::to_bf16_pairs};
  return ops;
}

}  // namespace tessel::kernels::attention::internal
