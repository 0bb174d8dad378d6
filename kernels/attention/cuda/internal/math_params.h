#pragma once
// The arguments of the math backend's CUDA kernels (math_cuda.cu) and their launchers.

#include <cstdint>

#include "tessel/kernels/attention/cuda/internal/flash_params.h"

#if defined(__CUDACC__) || defined(TESSEL_MATH_CUDA_LAUNCHERS)
#include <cuda_runtime_api.h>
#endif

namespace tessel::kernels::attention::cuda {

// Element types of the views: the three float formats of tensor/dtype.h.
enum class MathElem : uint8_t { kF32, kBf16, kF16 };

struct MathParams {
  DeviceView q, k, v, out, dout, dq, dk, dv;
  MathElem elem = MathElem::kF32;
  float* lse = nullptr;    // (B, H_q, S_q), may be null in forward
  float* probs = nullptr;  // scratch: (chunk heads, S_q, S_k) scores, then probabilities
  float* grads = nullptr;  // backward scratch: dP, then dS
  int batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  float scale = 1.0f;
  MaskParams mask;
  DropoutParams dropout;
  // The chunk: key/value heads [kv0, kv0 + kv_count) counted as b * H_kv + hk, i.e. query
  // heads [kv0 * group, (kv0 + kv_count) * group) counted as b * H_q + h.
  int64_t kv0 = 0, kv_count = 0;

  TESSEL_HD int group() const { return q_heads / kv_heads; }
  TESSEL_HD int64_t chunk_heads() const { return kv_count * group(); }
};

#if defined(__CUDACC__) || defined(TESSEL_MATH_CUDA_LAUNCHERS)
// Forward of one chunk (p.kv0, p.kv_count): scores, softmax with logsumexp, output. Issued on
// `stream`; throws the CUDA error of a failed launch.
void launch_math_forward(const MathParams& p, cudaStream_t stream);
// Backward of one chunk: scores and softmax again, dP, dS, dQ, then dK and dV.
void launch_math_backward(const MathParams& p, cudaStream_t stream);
#endif

}  // namespace tessel::kernels::attention::cuda
