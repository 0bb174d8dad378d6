// The device a process and its threads use: cuda::set_device (what init_process_group and
// train_gpt call at start-up with cuda:LOCAL_RANK) and the one DeviceGuard of the tensor
// backend, the kernels and the NCCL backend, which must not create a context on GPU 0 when it
// restores "device 0" on a thread that never chose a device. Its own program, so the process
// starts without contexts. The guard's tests need two GPUs and skip, printing why, with fewer;
// the error of a missing device is checked in every CUDA build.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel {
namespace {

TEST(CudaSetDeviceTest, AMissingDeviceIsUnavailableAndNamed) {
  const int count = cuda::device_count();
  try {
    cuda::set_device(count);
    FAIL() << "set_device(" << count << ") with " << count << " device(s) did not throw";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("cuda:{}", count)), std::string::npos)
        << e.what();
  }
}

TEST(CudaSetDeviceTest, MakesTheDeviceCurrent) {
  const int count = cuda::device_count();
  if (count == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  cuda::set_device(count - 1);
  EXPECT_EQ(cuda::current_device(), count - 1);
}

// A thread that never chose a device (cudaGetDevice says 0) works on cuda:1 under a guard; when
// the guard ends, GPU 0 must still have no context.
TEST(CudaDeviceGuardTest, LeavesNoContextOnDevice0ForAThreadThatNeverChoseOne) {
  if (cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices, the process sees " << cuda::device_count()
                 << (cuda::device_count() == 0 ? ": " + cuda::unavailable_reason() : "");
  }
  if (cuda::has_primary_context(0)) GTEST_SKIP() << "GPU 0 already has a context here";
  bool context_on_0 = true;
  int inside = -1;
  std::thread worker([&] {
    {
      cuda::DeviceGuard guard(1);
      cudaFree(nullptr);  // makes the context of cuda:1
      inside = cuda::current_device();
    }
    context_on_0 = cuda::has_primary_context(0);
  });
  worker.join();
  EXPECT_EQ(inside, 1);
  EXPECT_FALSE(context_on_0) << "the guard's restore created a context on GPU 0";
}

// A device the thread does use (it has a context) is restored.
TEST(CudaDeviceGuardTest, RestoresADeviceInUse) {
  if (cuda::device_count() < 2) {
    GTEST_SKIP() << "needs two CUDA devices, the process sees " << cuda::device_count();
  }
  cuda::set_device(1);
  cudaFree(nullptr);
  {
    cuda::DeviceGuard guard(0);
    EXPECT_EQ(cuda::current_device(), 0);
  }
  EXPECT_EQ(cuda::current_device(), 1);
}

}  // namespace
}  // namespace tessel
