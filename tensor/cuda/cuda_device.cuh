#pragma once
// Private device code shared by the cuda_*.cu files (which do not include fmt or base/error.h:
// nvcc's front end cannot evaluate fmt's compile-time checks; see cuda_check.h): element types and
// conversions through the compute type (f32 for floating dtypes, i64 for integers and bool, as on
// the CPU), dtype dispatch for launchers, the f32 functions of the CPU's cpu_math.h written with
// the same operations in the same order (each explicitly rounded: nvcc never fuses them into
// multiply-adds, so special values behave as on the CPU and results equal the CPU's baseline
// code bit for bit; the CPU's AVX2/AVX-512 clones may fuse and differ in the last bit),
// deterministic block reductions, and the device-side error report.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/cuda/cuda_kernels.h"

namespace tessel::cuda {

// ---- Element types ------------------------------------------------------------------------------

// bfloat16 as stored: the upper 16 bits of an f32 (conversions below, as dtype.h's BFloat16).
struct bf16 {
  uint16_t bits;
};
using f16 = __half;

template <typename T>
inline constexpr bool kIsFloat =
    std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <typename T>
using Compute = std::conditional_t<kIsFloat<T>, float, int64_t>;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) {
  return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
}
__device__ __forceinline__ float to_f32(f16 v) { return __half2float(v); }

// Round to nearest even; NaN stays a (quiet) NaN. The same bits as BFloat16::from_float.
__device__ __forceinline__ bf16 bf16_from_f32(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  return bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// Converts between any two element types (16-bit floats through f32), as cpu_loop.h's convert.
template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, f16>) {
    return convert<To>(to_f32(v));
  } else if constexpr (std::is_same_v<To, bf16>) {
    return bf16_from_f32(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, f16>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the device element type of `dtype` (host code of launchers).
template <typename F>
void dispatch_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kBF16:
      return f(TypeTag<bf16>{});
    case DType::kF16:
      return f(TypeTag<f16>{});
    case DType::kI64:
      return f(TypeTag<int64_t>{});
    case DType::kI32:
      return f(TypeTag<int32_t>{});
    case DType::kBool:
      return f(TypeTag<bool>{});
  }
  throw_internal("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

template <typename F>
void dispatch_floating(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(TypeTag<float>{});
    case DType::kBF16:
      return f(TypeTag<bf16>{});
    case DType::kF16:
      return f(TypeTag<f16>{});
    default:
      break;
  }
  throw_invalid_argument(std::string(what) + " needs a floating-point tensor, got " +
                         std::string(dtype_name(dtype)));
}

// ---- Launch geometry ----------------------------------------------------------------------------

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the device several times over.
inline unsigned int grid_for(int64_t n, const Launch& l, int threads = kThreads) {
  const int64_t wanted = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(l.sm_count) * 32;
  return static_cast<unsigned int>(wanted < 1 ? 1 : (wanted < cap ? wanted : cap));
}

// ---- f32 math as the CPU computes it ------------------------------------------------------------
// Each operation is rounded on its own (__f*_rn), in the order cpu_math.h and cpu_vector.cc
// use.

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }

__device__ __forceinline__ float fast_exp(float x) {
  x = x > 89.0f ? 89.0f : x;
  x = x < -104.0f ? -104.0f : x;
  const float shifted = add(mul(x, 1.44269504088896341f), 12582912.0f);
  const float n = sub(shifted, 12582912.0f);
  const int32_t ni = static_cast<int32_t>(__float_as_uint(shifted) - 0x4B400000u);
  float r = sub(x, mul(n, 0.693359375f));
  r = sub(r, mul(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = add(mul(p, r), 1.3981999507e-3f);
  p = add(mul(p, r), 8.3334519073e-3f);
  p = add(mul(p, r), 4.1665795894e-2f);
  p = add(mul(p, r), 1.6666665459e-1f);
  p = add(mul(p, r), 5.0000001201e-1f);
  p = add(add(mul(mul(p, r), r), r), 1.0f);
  const int32_t n1 = ni >> 1;
  const float s1 = __uint_as_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = __uint_as_float(static_cast<uint32_t>(ni - n1 + 127) << 23);
  return mul(mul(p, s1), s2);
}

__device__ __forceinline__ float fast_sigmoid(float x) {
  return div(1.0f, add(1.0f, fast_exp(-x)));
}

__device__ __forceinline__ float fast_tanh(float x) {
  const float z = mul(x, x);
  float q = -6.096714166e-03f;
  q = add(mul(q, z), 2.099717900e-02f);
  q = add(mul(q, z), -5.385090958e-02f);
  q = add(mul(q, z), 1.333276974e-01f);
  q = add(mul(q, z), -3.333332894e-01f);
  const float near_zero = mul(x, add(1.0f, mul(z, q)));
  const float ax = fabsf(x);
  const float e = fast_exp(mul(-2.0f, ax));
  const float far = copysignf(div(sub(1.0f, e), add(1.0f, e)), x);
  return ax < 0.625f ? near_zero : far;
}

__device__ __forceinline__ float fast_normal_cdf(float x) {
  const float ax = fabsf(x);
  const float t = div(1.0f, add(1.0f, mul(0.35355339059327376f, ax)));
  float g = -1.857025437e-02f;
  g = add(mul(g, t), 3.404347849e-02f);
  g = add(mul(g, t), 8.598342588e-02f);
  g = add(mul(g, t), -2.523635427e-01f);
  g = add(mul(g, t), 1.098438108e-01f);
  g = add(mul(g, t), 4.826816996e-02f);
  g = add(mul(g, t), 1.822434340e-01f);
  g = add(mul(g, t), 2.463468137e-01f);
  g = add(mul(g, t), 2.821098754e-01f);
  g = add(mul(g, t), 2.820947160e-01f);
  const float half_erfc = mul(mul(mul(0.5f, t), g), fast_exp(mul(-0.5f, mul(ax, ax))));
  return x < 0.0f ? half_erfc : sub(1.0f, half_erfc);
}

// sigmoid(2u) for the tanh form of gelu, u = sqrt(2 / pi) (x + 0.044715 x^3).
__device__ __forceinline__ float gelu_tanh_gate(float v) {
  return fast_sigmoid(mul(v, add(1.5957691216057308f, mul(0.071354816272681539f, mul(v, v)))));
}

// ---- Deterministic reductions within a block ----------------------------------------------------
// Butterfly exchanges within warps, then warp 0 combines the warps' results: a fixed order for
// a given block size, so results repeat bit for bit.

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The combination over all threads of the block, returned to every thread. `shared` holds at
// least 32 T; blockDim.x is a multiple of 32. Contains __syncthreads: every thread must call.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // shared may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? shared[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  return shared[0];
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxSkipNanOp {  // the larger, ignoring NaN (as max_f32 skips it)
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// ---- Device-side errors -------------------------------------------------------------------------

// Records a bad value (the first report on the device wins); see DeviceErrorRecord.
__device__ __forceinline__ void report_bad_index(DeviceErrorRecord* r, DeviceCheck check,
                                                 long long value, long long position,
                                                 long long limit) {
  if (atomicCAS(&r->state, 0u, 1u) != 0u) return;
  r->check = static_cast<int>(check);
  r->value = value;
  r->position = position;
  r->limit = limit;
  __threadfence_system();
  atomicExch(&r->state, 2u);
}

}  // namespace tessel::cuda
