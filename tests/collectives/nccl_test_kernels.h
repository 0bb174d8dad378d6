#pragma once
// Kernels the NCCL tests put on a caller's stream (nccl_test_kernels.cu, compiled by nvcc).

#include <cuda_runtime.h>

namespace tessel::testing {

// One thread that spins (sleeping 1 us per check) until *flag, page-locked host memory mapped
// into the device, is non-zero: a kernel whose end the test decides.
void launch_spin_until_set(const volatile int* flag, cudaStream_t stream);

}  // namespace tessel::testing
