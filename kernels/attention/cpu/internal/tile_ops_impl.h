#pragma once
// The tile kernels of tile_ops.h as templates over a vector type V (see tile_ops_avx512.cc for
// the interface V provides). Included only by the per-ISA .cc files, which compile it with
// their own target flags; everything here has internal linkage per ISA namespace.

#include <cmath>
#include <cstdint>
#include <utility>

#include "tessel/kernels/attention/cpu/internal/tile_ops.h"

namespace tessel::kernels::attention::internal::TESSEL_TILE_ISA {

template <class E>
using MicroFn = void (*)(int64_t k, const E* a, int64_t a_row, int64_t a_col, const E* b,
                         int64_t ldb, float* c, int64_t ldc, bool accumulate);

// C[MR x NV*W] (+)= A[MR x k] B[k x NV*W]: the register-blocked inner kernel. Each step loads
// NV vectors of B and broadcasts one A element per row. V::Elem is float (one product per
// lane and step) or a pair of bf16 in a uint32_t (V::madd is then a 2-element dot product).
template <class V, int MR, int NV>
void micro(int64_t k, const typename V::Elem* a, int64_t a_row, int64_t a_col,
           const typename V::Elem* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  typename V::Reg acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = accumulate ? V::load(c + r * ldc + v * V::kWidth) : V::zero();
    }
  }
  for (int64_t p = 0; p < k; ++p) {
    typename V::Reg bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = V::load_b(b + p * ldb + v * V::kWidth);
    const typename V::Elem* ap = a + p * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const typename V::Reg ar = V::broadcast_a(ap + r * a_row);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = V::madd(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::store(c + r * ldc + v * V::kWidth, acc[r][v]);
  }
}

// The micro-kernels for every (rows, vectors) shape up to (MR, NV), indexed (r-1) * NV + (v-1).
// A plain array rather than std::array: no std:: code is instantiated under this file's ISA.
template <class V, int NV, class Seq>
struct MicroTable;
template <class V, int NV, int... I>
struct MicroTable<V, NV, std::integer_sequence<int, I...>> {
  static constexpr MicroFn<typename V::Elem> fns[] = {&micro<V, I / NV + 1, I % NV + 1>...};
};

// C[m x n] (+)= A B over micro-kernel calls; n a multiple of V::kWidth.
template <class V, int MR, int NV>
void gemm(int64_t m, int64_t n, int64_t k, const typename V::Elem* a, int64_t a_row, int64_t a_col,
          const typename V::Elem* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const auto& table = MicroTable<V, NV, std::make_integer_sequence<int, MR * NV>>::fns;
  constexpr int64_t panel = int64_t{NV} * V::kWidth;
  for (int64_t j = 0; j < n; j += panel) {
    // Plain ternaries, not std::min: a std:: template instantiated in this TU (with its ISA
    // flags) could be the copy the linker keeps for the baseline code too.
    const int64_t nv = (n - j) / V::kWidth < NV ? (n - j) / V::kWidth : NV;
    for (int64_t i = 0; i < m; i += MR) {
      const int64_t mr = m - i < MR ? m - i : MR;
      table[(mr - 1) * NV + (nv - 1)](k, a + i * a_row, a_row, a_col, b + j, ldb, c + i * ldc + j,
                                      ldc, accumulate);
    }
  }
}

template <class V>
float exp2_affine(float* x, int64_t n, float mul, float sub) {
  const auto vmul = V::set1(mul), vsub = V::set1(sub);
  auto sum = V::zero();
  for (int64_t j = 0; j < n; j += V::kWidth) {
    const auto e = V::exp2(V::fmsub(V::load(x + j), vmul, vsub));
    V::store(x + j, e);
    sum = V::add(sum, e);
  }
  return V::reduce_add(sum);
}

// max_j x[j * ld] over j < rows, elementwise (-inf for no rows), by four independent chains:
// one chain waits a max's latency (4 cycles) per row.
template <class V>
typename V::Reg column_max(const float* x, int64_t rows, int64_t ld) {
  const auto lowest = V::set1(-__builtin_huge_valf());
  typename V::Reg mx[4] = {lowest, lowest, lowest, lowest};
  int64_t j = 0;
  for (; j + 4 <= rows; j += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) mx[u] = V::max(mx[u], V::load(x + (j + u) * ld));
  }
  for (; j < rows; ++j) mx[0] = V::max(mx[0], V::load(x + j * ld));
  return V::max(V::max(mx[0], mx[1]), V::max(mx[2], mx[3]));
}

// How far (in log2 units) a score may exceed its query's running maximum m before m is moved
// and the output rescaled: the exponentials stay below 2^kRescaleSlack (far from f32 overflow)
// and l and O^T are scaled alike, so the result is the same, while the rescaling pass over O^T,
// needed after nearly every tile when m must be the exact maximum, is rare.
inline constexpr float kRescaleSlack = 8.0f;

// See TileOps::softmax_step. Vectors run along the queries, so every step is vertical: no
// horizontal reductions, no per-query scalar work.
template <class V>
void softmax_step(float* st, int64_t keys, int64_t n, float mul, float* m, float* l, float* ot,
                  int64_t out_rows, float* alpha) {
  const auto vmul = V::set1(mul);
  const auto lowest = V::set1(-__FLT_MAX__);
  const auto slack = V::set1(kRescaleSlack);
  for (int64_t i = 0; i < n; i += V::kWidth) {
    const auto m_old = V::load(m + i);
    // mul > 0: the max commutes with it.
    const auto m_tile = V::mul(column_max<V>(st + i, keys, n), vmul);
    // The maxima move only when a score passes them by more than the slack (or was -inf).
    const bool moves = V::any_greater(m_tile, V::add(m_old, slack));
    const auto m_new = moves ? V::max(m_old, m_tile) : m_old;
    // A query that sees no key yet has m_new = -inf: subtracting `lowest` instead keeps its
    // exponentials (and its factor 2^(m_old - ...)) at 0 rather than NaN.
    const auto sub = V::max(m_new, lowest);
    const auto a = moves ? V::exp2(V::sub(m_old, sub)) : V::set1(1.0f);
    auto sum = V::zero();
    for (int64_t j = 0; j < keys; ++j) {
      const auto e = V::exp2(V::fmsub(V::load(st + j * n + i), vmul, sub));
      V::store(st + j * n + i, e);
      sum = V::add(sum, e);
    }
    V::store(l + i, V::fmadd(V::load(l + i), a, sum));
    V::store(m + i, m_new);
    V::store(alpha + i, a);
    if (!moves) continue;  // the common case once the maxima settle
    for (int64_t c = 0; c < out_rows; ++c) {
      V::store(ot + c * n + i, V::mul(V::load(ot + c * n + i), a));
    }
  }
}

// See TileOps::ds_rows.
template <class V>
void ds_rows(const float* p, const float* keep, const float* delta, int64_t rows, int64_t n,
             float* dp) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto d = V::set1(delta[r]);
    for (int64_t j = r * n; j < (r + 1) * n; j += V::kWidth) {
      auto g = V::load(dp + j);
      if (keep) g = V::mul(g, V::load(keep + j));
      V::store(dp + j, V::mul(V::load(p + j), V::sub(g, d)));
    }
  }
}

// See TileOps::transpose. Whole 16 x 16 blocks go through V::transpose_block where the vector
// type has one; the edges (and every other ISA) element by element.
template <class V>
void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst, const float* col_scale) {
  auto edge = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        dst[c * ld_dst + r] = src[r * ld_src + c] * (col_scale ? col_scale[c] : 1.0f);
      }
    }
  };
  int64_t r0 = 0;
  if constexpr (requires { V::transpose_block(src, ld_src, dst, ld_dst, col_scale); }) {
    for (; r0 + 16 <= rows; r0 += 16) {
      int64_t c0 = 0;
      for (; c0 + 16 <= cols; c0 += 16) {
        V::transpose_block(src + r0 * ld_src + c0, ld_src, dst + c0 * ld_dst + r0, ld_dst,
                           col_scale ? col_scale + c0 : nullptr);
      }
      edge(r0, r0 + 16, c0, cols);
    }
  }
  edge(r0, rows, 0, cols);
}

// 2^f on [0, 1], degree 6: least-squares fit of the relative error at 400 Chebyshev nodes.
// Evaluated in f32 by Horner (FMAs) its relative error is below 6.3e-8 (the same fit on
// [-0.5, 0.5] gave 7.9e-8: f32 rounding dominates), p(0) = 1 and p(1) = 2 exactly. The
// fraction x - floor(x) lets the AVX-512 kernels scale by 2^floor(x) with vscalefps on x itself.
inline constexpr int kExp2Degree = 6;
inline constexpr float kExp2Poly[kExp2Degree + 1] = {
    1.0f, 0.693147004f, 0.2402298f, 0.0554835238f, 0.00967847276f, 0.00124430819f, 0.00021690609f};

// Vector types for f32 products provide these from their basic operations.
template <class Base>
struct F32Products : Base {
  using Elem = float;
  static typename Base::Reg load_b(const float* p) { return Base::load(p); }
  static typename Base::Reg broadcast_a(const float* p) { return Base::set1(*p); }
  static typename Base::Reg madd(typename Base::Reg a, typename Base::Reg b,
                                 typename Base::Reg acc) {
    return Base::fmadd(a, b, acc);
  }
};

template <class V, int MR, int NV>
const TileOps& make_tile_ops(const char* name) {
  static const TileOps ops{
      name,         &gemm<F32Products<V>, MR, NV>, &exp2_affine<V>, &softmax_step<V>, &ds_rows<V>,
      &transpose<V>};
  return ops;
}

}  // namespace tessel::kernels::attention::internal::TESSEL_TILE_ISA
