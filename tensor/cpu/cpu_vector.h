#pragma once
// Private: contiguous f32 loops for the floating-point unary and binary ops, compiled for
// AVX-512 (x86-64-v4), AVX2+FMA (x86-64-v3) and baseline x86-64, the best one chosen when the
// library loads (GCC target_clones). bf16/f16 and strided operands reach them through f32 tiles.

#include <cstdint>

#include "tessel/tensor/backend.h"

namespace tessel::cpu {

// Elements per f32 tile when widening 16-bit floats or gathering strided operands.
inline constexpr int64_t kTile = 256;

// out[i] = op(x[i]) for every floating UnaryOp except kLogicalNot. out may equal x.
void unary_f32(UnaryOp op, const float* x, float* out, int64_t n);
// out[i] = op(a[i], b[i * b_step]) (b_step 0 broadcasts b[0]). out may equal a.
void binary_f32(BinaryOp op, const float* a, const float* b, int64_t b_step, float* out, int64_t n);
// Contiguous 16-bit floats to f32 and back (round to nearest even).
void widen(const BFloat16* x, float* out, int64_t n);
void widen(const Half* x, float* out, int64_t n);
void narrow(const float* x, BFloat16* out, int64_t n);
void narrow(const float* x, Half* out, int64_t n);
// Row reductions on contiguous f32 with 16 lanes combined in a fixed order (the same result
// from every clone and thread count).
float max_f32(const float* x, int64_t n);
float sum_f32(const float* x, int64_t n);
float dot_f32(const float* x, const float* y, int64_t n);
// sum_i exp(x[i] - shift).
float sum_exp_f32(const float* x, float shift, int64_t n);
// Whether binary_f32 implements op (arithmetic and backward ops; not comparisons).
bool binary_f32_supported(BinaryOp op);

}  // namespace tessel::cpu
