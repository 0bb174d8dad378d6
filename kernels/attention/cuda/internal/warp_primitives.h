#pragma once
// The primitives the CUDA attention kernels are written with: tensor-core MMA (m16n8k16, bf16 or
// f16 in, f32 accumulate), ldmatrix, cp.async with zero fill, quad shuffles, CTA barriers, fast
// exp2 and f32 atomics. Compiled by nvcc they are inline PTX; compiled as plain C++ (no
// __CUDACC__) they are only declared, and tests/kernels/attention_cuda_emulator.cc defines them
// with one host thread per CUDA thread, so the kernels' own logic runs (slowly) on the CPU.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
// t = lane % 4:
//   A (16 x 16, row-major):  reg 0 = (g, 2t..2t+1)  reg 1 = (g+8, 2t..)  reg 2 = (g, 2t+8..)
//                            reg 3 = (g+8, 2t+8..)
//   B (16 x 8, "col"):       reg 0 = (k 2t..2t+1, n g)  reg 1 = (k 2t+8.., n g)
//   C/D (16 x 8, f32):       c0, c1 = (g, 2t..2t+1)  c2, c3 = (g+8, 2t..2t+1)
// A 32-bit register holds two 16-bit elements, the lower column (or k) in the low half.

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__)
#define TESSEL_HD __host__ __device__ __forceinline__
#define TESSEL_DEVICE __device__ __forceinline__
#else
#define TESSEL_HD inline
#define TESSEL_DEVICE inline
#endif

namespace tessel::kernels::attention::cuda {

// The 16-bit input type of the tensor-core products.
enum class Elem : uint8_t { kBf16, kF16 };

#if defined(__CUDACC__)

TESSEL_DEVICE int thread_index() { return static_cast<int>(threadIdx.x); }
TESSEL_DEVICE void cta_sync() { __syncthreads(); }
TESSEL_DEVICE float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// An address in shared memory: a 32-bit offset in the .shared window (half the registers of a
// generic pointer), or a plain pointer in the host emulation. Byte arithmetic works on both.
using SmemAddr = uint32_t;
TESSEL_DEVICE SmemAddr smem_address(const void* p) {
  return static_cast<SmemAddr>(__cvta_generic_to_shared(p));
}
TESSEL_DEVICE SmemAddr smem_xor(SmemAddr a, uint32_t x) { return a ^ x; }
TESSEL_DEVICE void st_shared_u32(SmemAddr a, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
TESSEL_DEVICE void st_shared_f32(SmemAddr a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
TESSEL_DEVICE float ld_shared_f32(SmemAddr a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
  return v;
}
// 16 bytes from shared memory to global memory.
TESSEL_DEVICE void copy16_to_global(void* dst, SmemAddr src) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(src)
               : "memory");
  *static_cast<uint4*>(dst) = v;
}

// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses of matrix i,
// and r[i] receives (row lane / 4, columns 2 (lane % 4), +1) of matrix i.
TESSEL_DEVICE void ldmatrix_x4(uint32_t (&r)[4], SmemAddr row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}
// As ldmatrix_x4 with each matrix transposed: r[i] receives (rows 2 (lane % 4), +1; column
// lane / 4) of the stored matrix i.
TESSEL_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], SmemAddr row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

// d += a * b on the tensor cores.
template <Elem E>
TESSEL_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (E == Elem::kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded (to nearest even) to the 16-bit type and packed, lo in the low half.
template <Elem E>
TESSEL_DEVICE uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (E == Elem::kBf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// One 16-bit element as float.
template <Elem E>
TESSEL_DEVICE float to_float(uint16_t bits) {
  if constexpr (E == Elem::kBf16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

// Asynchronous 16-byte (and 4-byte) copies global -> shared. With pred false nothing is read
// and the destination is zero-filled.
TESSEL_DEVICE void cp_async_16(SmemAddr dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :
               : "r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
TESSEL_DEVICE void cp_async_4(SmemAddr dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
               :
               : "r"(dst), "l"(src), "r"(pred ? 4 : 0));
}
TESSEL_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
TESSEL_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// 2^x (ex2.approx.ftz: 2 ulp; -inf gives +0).
TESSEL_DEVICE float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
TESSEL_DEVICE void atomic_add_f32(float* p, float v) { atomicAdd(p, v); }
// 16-byte global loads and stores (16-byte aligned addresses).
TESSEL_DEVICE void load16(uint32_t (&r)[4], const void* src) {
  const uint4 v = *static_cast<const uint4*>(src);
  r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
}
TESSEL_DEVICE void store16(void* dst, const uint32_t (&r)[4]) {
  *static_cast<uint4*>(dst) = make_uint4(r[0], r[1], r[2], r[3]);
}

#else  // Host emulation (tests/kernels/attention_cuda_emulator.cc).

int thread_index();
void cta_sync();
float shfl_xor(float v, int mask);
using SmemAddr = char*;
inline SmemAddr smem_address(const void* p) { return static_cast<char*>(const_cast<void*>(p)); }
inline SmemAddr smem_xor(SmemAddr a, uint32_t x) {
  return reinterpret_cast<SmemAddr>(reinterpret_cast<uintptr_t>(a) ^ x);
}
void st_shared_u32(SmemAddr a, uint32_t v);
void st_shared_f32(SmemAddr a, float v);
float ld_shared_f32(SmemAddr a);
void copy16_to_global(void* dst, SmemAddr src);
void ldmatrix_x4(uint32_t (&r)[4], SmemAddr row);
void ldmatrix_x4_trans(uint32_t (&r)[4], SmemAddr row);
void emulated_mma_16816(bool bf16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
uint32_t emulated_pack2(bool bf16, float lo, float hi);
float emulated_to_float(bool bf16, uint16_t bits);
void cp_async_16(SmemAddr dst, const void* src, bool pred);
void cp_async_4(SmemAddr dst, const void* src, bool pred);
void cp_async_commit();
void emulated_cp_async_wait(int n);
float exp2_fast(float x);
void atomic_add_f32(float* p, float v);
void load16(uint32_t (&r)[4], const void* src);
void store16(void* dst, const uint32_t (&r)[4]);

template <Elem E>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emulated_mma_16816(E == Elem::kBf16, d, a, b0, b1);
}
template <Elem E>
inline uint32_t pack2(float lo, float hi) {
  return emulated_pack2(E == Elem::kBf16, lo, hi);
}
template <Elem E>
inline float to_float(uint16_t bits) {
  return emulated_to_float(E == Elem::kBf16, bits);
}
template <int n>
inline void cp_async_wait() {
  emulated_cp_async_wait(n);
}

#endif

}  // namespace tessel::kernels::attention::cuda
