// The NCCL backend on this machine's GPUs: a world of one rank per visible device (threads, one
// per device, rendezvous through a MemoryStore). Skipped with the reason where no GPU exists.

#include "tessel/collectives/nccl/nccl_backend.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>

#include "tessel/base/error.h"
#include "tessel/collectives/memory_store.h"

namespace tessel {
namespace {

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

TEST(NcclBackendTest, AllReduceSumsAcrossDevices) {
  if (!nccl_is_available()) GTEST_SKIP() << "no CUDA device visible: NCCL tests need a GPU";
  const int size = device_count();
  auto store = std::make_shared<MemoryStore>(std::chrono::seconds(60));
  const int64_t n = 1001;
  std::vector<std::vector<float>> results(static_cast<size_t>(size));
  std::vector<std::thread> ranks;
  std::exception_ptr failure;
  std::mutex mutex;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      try {
        auto pg = nccl_create_process_group(store, r, size, {.device = r});
        Tensor t;
        try {
          t = empty({n}, DType::kF32, Device::cuda(r));
        } catch (const Unavailable& e) {
          throw Unavailable(std::string("CUDA tensors: ") + e.what());
        }
        std::vector<float> host(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(r + i % 5);
        ASSERT_EQ(cudaMemcpy(t.data_ptr(), host.data(), t.nbytes(), cudaMemcpyHostToDevice),
                  cudaSuccess);
        pg->all_reduce(t);
        results[r].resize(static_cast<size_t>(n));
        ASSERT_EQ(cudaMemcpy(results[r].data(), t.data_ptr(), t.nbytes(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
      } catch (...) {
        std::lock_guard lock(mutex);
        failure = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const Unavailable& e) {
      GTEST_SKIP() << e.what();
    }
  }
  const float rank_sum = static_cast<float>(size * (size - 1) / 2);
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(results[r][i], rank_sum + static_cast<float>(size * (i % 5))) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace tessel
