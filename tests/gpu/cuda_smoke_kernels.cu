// A tiny kernel to prove the toolchain builds for every configured architecture and the
// runtime can launch it.
#include <cuda_runtime.h>

namespace {
__global__ void axpy_kernel(float a, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
}  // namespace

cudaError_t smoke_axpy(float a, const float* x, float* y, int n) {
  axpy_kernel<<<(n + 255) / 256, 256>>>(a, x, y, n);
  return cudaGetLastError();
}
