#include "nccl_test_kernels.h"

namespace tessel::testing {
namespace {

__global__ void spin_until_set(const volatile int* flag) {
  while (*flag == 0) __nanosleep(1000);
}

}  // namespace

void launch_spin_until_set(const volatile int* flag, cudaStream_t stream) {
  spin_until_set<<<1, 1, 0, stream>>>(flag);
}

}  // namespace tessel::testing
