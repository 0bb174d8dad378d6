// Checks that CUDA code built here launches and computes on a GPU. Skips with the reason where
// tessel was built without CUDA or no device is visible.
#include <gtest/gtest.h>

#include <vector>

#ifdef TESSEL_TEST_HAVE_CUDA
#include <cuda_runtime.h>
cudaError_t smoke_axpy(float a, const float* x, float* y, int n);
#endif

namespace {

TEST(CudaSmokeTest, AxpyOnDevice) {
#ifndef TESSEL_TEST_HAVE_CUDA
  GTEST_SKIP() << "tessel was built without CUDA (TESSEL_WITH_CUDA off or nvcc not found)";
#else
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no CUDA device: "
                 << (status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
  }
  constexpr int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  float *dx = nullptr, *dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(smoke_axpy(2.0f, dx, dy, n), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dx);
  cudaFree(dy);
  for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], 2.0f * i + 1.0f) << "at " << i;
#endif
}

}  // namespace
