#pragma once
// The arguments of the Llama kernels on CUDA (rope_cuda.cu, swiglu_cuda.cu), their launch
// geometry and element access, written once for the device and the host so that tests run the
// kernels' per-thread bodies on the CPU (tests/kernels/llama_cuda_emulated_test.cc).

#include <cstdint>

#include "tessel/tensor/dtype.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
#if defined(__CUDACC__) || defined(TESSEL_LLAMA_CUDA_LAUNCHERS)
#include <cuda_runtime_api.h>
#endif

#if defined(__CUDACC__)
#define TESSEL_LLAMA_HD __host__ __device__ __forceinline__
#else
#define TESSEL_LLAMA_HD inline
#endif

namespace tessel::kernels::cuda {

// Element types of the tensors: the three float formats of tensor/dtype.h.
enum class LlamaElem : uint8_t { kF32, kBf16, kF16 };

// ---- Launch geometry ---------------------------------------------------------------------------

inline constexpr int kLlamaThreads = 256;
inline constexpr int64_t kLlamaMaxBlocks = int64_t{1} << 16;

// Blocks of a grid-stride loop over n work items: one item per thread up to kLlamaMaxBlocks
// blocks, then each thread strides over several. 0 for n <= 0 (nothing is launched).
TESSEL_LLAMA_HD int64_t llama_blocks(int64_t n) {
  if (n <= 0) return 0;
  const int64_t wanted = (n + kLlamaThreads - 1) / kLlamaThreads;
  return wanted < kLlamaMaxBlocks ? wanted : kLlamaMaxBlocks;
}

// The grid-stride loop of thread `thread` of block `block` in a grid of `blocks`: body(i) for
// every item i < n it owns. The kernels call it with their CUDA indices, the tests with loops.
template <typename Body>
TESSEL_LLAMA_HD void llama_grid_stride(int64_t n, int64_t block, int64_t blocks, int64_t thread,
                                       Body&& body) {
  const int64_t stride = blocks * kLlamaThreads;
  for (int64_t i = block * kLlamaThreads + thread; i < n; i += stride) body(i);
}

// ---- Element access (f32 in registers, rounded once to nearest even on the way out) --------

template <LlamaElem E>
TESSEL_LLAMA_HD float load_elem(const void* data, int64_t i) {
  if constexpr (E == LlamaElem::kF32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (E == LlamaElem::kBf16) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(data)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  } else {
    const uint16_t bits = static_cast<const uint16_t*>(data)[i];
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(bits));
#else
    Half h;
    h.bits = bits;
    return static_cast<float>(h);
#endif
  }
}

template <LlamaElem E>
TESSEL_LLAMA_HD void store_elem(void* data, int64_t i, float v) {
  if constexpr (E == LlamaElem::kF32) {
    static_cast<float*>(data)[i] = v;
  } else if constexpr (E == LlamaElem::kBf16) {
    uint32_t u;
    __builtin_memcpy(&u, &v, 4);
    // Round to nearest even; a NaN stays a quiet NaN (as BFloat16::from_float).
    const uint32_t bits = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x0040u
                                                          : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    static_cast<uint16_t*>(data)[i] = static_cast<uint16_t>(bits);
  } else {
#if defined(__CUDA_ARCH__)
    static_cast<uint16_t*>(data)[i] = __half_as_ushort(__float2half_rn(v));
#else
    static_cast<uint16_t*>(data)[i] = Half(v).bits;
#endif
  }
}

// ---- Arguments -------------------------------------------------------------------------------

// RoPE over contiguous x and out (B, T, H, D) with contiguous f32 tables (T, D/2) or
// (B, T, D/2): one work item per rotated pair (row b * T + t, head h, i < D/2), i fastest.
struct RopeParams {
  const void* x = nullptr;
  void* out = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rows = 0;   // B * T
  int64_t seq = 0;    // T
  int64_t heads = 0;  // H
  int64_t half = 0;   // D / 2
  float sign = 1.0f;  // -1: the inverse rotation (backward)
  bool batched_tables = false;

  TESSEL_LLAMA_HD int64_t pairs() const { return rows * heads * half; }
};

// SwiGLU over n contiguous elements: forward reads gate, up and writes out; backward reads
// grad, gate, up and writes grad_gate, grad_up.
struct SwigluParams {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* grad = nullptr;
  void* out = nullptr;
  void* grad_gate = nullptr;
  void* grad_up = nullptr;
  int64_t n = 0;
};

#if defined(__CUDACC__) || defined(TESSEL_LLAMA_CUDA_LAUNCHERS)
// Each launcher issues one kernel on `stream` (the device current) and nothing for an empty
// problem; throws the CUDA error of a failed launch.
void launch_rope(const RopeParams& p, LlamaElem elem, cudaStream_t stream);
void launch_swiglu_forward(const SwigluParams& p, LlamaElem elem, cudaStream_t stream);
void launch_swiglu_backward(const SwigluParams& p, LlamaElem elem, cudaStream_t stream);
#endif

}  // namespace tessel::kernels::cuda
