#pragma once
// Launchers of the CUDA attention kernels (flash_cuda_forward.cu, flash_cuda_backward.cu).
// Each issues its kernels on `stream` of the current device and returns without waiting; a
// failed launch throws (tensor/cuda/cuda_check.h).

#include <cuda_runtime_api.h>

#include "tessel/kernels/attention/cuda/internal/flash_params.h"

namespace tessel::kernels::attention::cuda {

// out and lse of p. kernel_head_dim is 64 or 128 (p.head_dim <= it).
void launch_flash_forward(const FlashParams& p, Elem elem, int kernel_head_dim,
                          cudaStream_t stream);

// dq, dk, dv of p from out, dout and lse; p.delta (B * H_q * S_q floats) is scratch. With
// p.dq_accum set (B * H_q * S_q * kernel_head_dim floats of scratch), dQ is accumulated with
// f32 atomics by the dK/dV kernel; with it null, a second kernel computes dQ alone and every
// result is bitwise reproducible (deterministic).
void launch_flash_backward(const FlashParams& p, Elem elem, int kernel_head_dim,
                           cudaStream_t stream);

// Lets `kernel` use `bytes` of dynamic shared memory on the current device (asked once per
// kernel and device; a no-op up to the default 48 KiB).
void allow_dynamic_smem(const void* kernel, int bytes);

}  // namespace tessel::kernels::attention::cuda
