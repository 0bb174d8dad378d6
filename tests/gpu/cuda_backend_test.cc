// The CUDA backend on a device: streams and events, the caching allocator (statistics, the
// stream rule, out-of-memory text), copies with pinned memory, bad indices found by kernels and
// reported at the next synchronisation, and random draws (dropout masks included) equal to the
// CPU's bit for bit. Skips with the reason where the process sees no CUDA device; the error
// texts of failed CUDA calls are checked in every CUDA build.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/caching_allocator.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/cuda/cuda_runtime.h"
#include "tessel/tensor/cuda/gemm_cache.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/stream.h"

namespace tessel {
namespace {

#define TESSEL_REQUIRE_CUDA()                                           \
  do {                                                                  \
    if (cuda::device_count() == 0) {                                    \
      GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason(); \
    }                                                                   \
  } while (0)

const Device kGpu = Device::cuda(0);

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// ---- Without a device: the text of CUDA errors
// ----------------------------------------------------

TEST(CudaErrorTextTest, NamesTheCallTheDeviceAndTheKernelsLaunchedLast) {
  // Record two launches (check_launch throws here when no driver is present: ignore that).
  for (const char* kernel : {"kernel_one", "kernel_two"}) {
    try {
      cuda::check_launch(kernel, 0);
    } catch (const Error&) {
    }
  }
  const std::string async = error_of<Internal>(
      [] { cuda::throw_cuda_error(cudaErrorIllegalAddress, "cudaStreamSynchronize", 0); });
  expect_contains(async, "cudaStreamSynchronize failed on cuda:0");
  expect_contains(async, "cudaErrorIllegalAddress");
  expect_contains(async, "kernel_two, kernel_one");
  expect_contains(async, "CUDA_LAUNCH_BLOCKING=1");
  expect_contains(error_of<OutOfMemory>(
                      [] { cuda::throw_cuda_error(cudaErrorMemoryAllocation, "cudaMalloc", 1); }),
                  "cudaMalloc failed on cuda:1");
  expect_contains(
      error_of<Unavailable>(
          [] { cuda::throw_cuda_error(cudaErrorNoKernelImageForDevice, "launch of kernel k", 0); }),
      "this build has code for CUDA architectures");
}

// ---- Streams and events
// ---------------------------------------------------------------------------

TEST(CudaRuntimeTest, StreamsEventsAndTiming) {
  TESSEL_REQUIRE_CUDA();
  EXPECT_FALSE(cuda::device_name(0).empty());
  const Stream def = default_stream(kGpu);
  EXPECT_EQ(def.id(), 0);
  const Stream a = create_stream(kGpu), b = create_stream(kGpu), high = create_stream(kGpu, -1);
  EXPECT_NE(a.id(), b.id());
  EXPECT_NE(high.id(), a.id());
  Event start(kGpu, true), end(kGpu, true);
  Tensor x = randn({1024, 1024}, DType::kF32, kGpu);
  {
    StreamGuard on_a(a);
    start.record();
    for (int i = 0; i < 4; ++i) x = matmul(x, x) / 1024.0;
    end.record();
  }
  b.wait(end);  // b's later work runs after a's matmuls
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_GT(start.elapsed(end).count(), 0);
  a.synchronize();
  EXPECT_TRUE(a.query());
  synchronize(kGpu);
}

// Events come from the runtime's pool: an operation's events are reused, not made anew.
TEST(CudaRuntimeTest, EventsAreReusedFromThePool) {
  TESSEL_REQUIRE_CUDA();
  { Event warm(kGpu, true); }
  const auto before = cuda::cuda_runtime().event_counts();
  for (int i = 0; i < 100; ++i) {
    Event start(kGpu, true), end(kGpu, true);
    start.record();
    end.record();
    end.synchronize();
  }
  const auto after = cuda::cuda_runtime().event_counts();
  EXPECT_LE(after.created - before.created, 1) << "two events at a time: one more at most";
  EXPECT_GE(after.reused - before.reused, 199);
}

// A repeated matmul reuses its cuBLASLt setup (gemm_cache.h): one miss, then hits.
TEST(CudaMatmulTest, RepeatedProblemReusesItsCublasLtSetup) {
  TESSEL_REQUIRE_CUDA();
  const Tensor a = randn({48, 40}, DType::kBF16, kGpu), b = randn({40, 56}, DType::kBF16, kGpu);
  const auto before = cuda::thread_gemm_cache_counts();
  auto product = [&] { return to_vector<float>(to(to(matmul(a, b), DType::kF32), Device::cpu())); };
  const std::vector<float> first = product();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(product(), first) << "same setup, same bits";
  const auto after = cuda::thread_gemm_cache_counts();
  EXPECT_EQ(after.misses - before.misses, 1);
  EXPECT_EQ(after.hits - before.hits, 10);
}

// Full reductions and tall columns: many chunk partials, combined by one block per output
// (cuda_reduce_plan.h); integer-valued floats, so every order gives the CPU's sum exactly.
TEST(CudaReduceTest, FullAndTallReductionsMatchTheCpu) {
  TESSEL_REQUIRE_CUDA();
  const int64_t n = (int64_t{1} << 21) + 7;  // 129 chunks of 16,384
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i % 7 - 3);
  const Tensor host = from_vector<float>(values);
  const Tensor gpu = to(host, kGpu);
  EXPECT_EQ(item(sum(gpu)), item(sum(host)));
  EXPECT_EQ(item(max(gpu)), 3.0);
  EXPECT_NEAR(item(mean(gpu)), item(mean(host)), 1e-6);
  // [n / 3, 3] summed over rows: 3 columns of 699,052 rows, 2,731 chunks each.
  const Tensor tall = view(narrow(gpu, 0, 0, n / 3 * 3), {n / 3, 3});
  const Tensor tall_host = view(narrow(host, 0, 0, n / 3 * 3), {n / 3, 3});
  EXPECT_EQ(to_vector<float>(to(sum(tall, {0}), Device::cpu())),
            to_vector<float>(sum(tall_host, {0})));
}

// ---- The caching allocator
// ------------------------------------------------------------------------

TEST(CudaAllocatorTest, StatisticsFollowTensors) {
  TESSEL_REQUIRE_CUDA();
  synchronize(kGpu);
  empty_cache(kGpu);
  reset_peak_memory_stats(kGpu);
  const MemoryStats before = memory_stats(kGpu);
  {
    Tensor t = empty({10 << 20}, DType::kF32, kGpu);  // 40 MiB
    const MemoryStats during = memory_stats(kGpu);
    EXPECT_EQ(during.allocated_bytes - before.allocated_bytes, int64_t{40} << 20);
    EXPECT_GE(during.reserved_bytes - before.reserved_bytes, int64_t{40} << 20);
    EXPECT_EQ(during.allocations, before.allocations + 1);
  }
  const MemoryStats after = memory_stats(kGpu);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + (int64_t{40} << 20));
  EXPECT_EQ(after.frees, before.frees + 1);
  empty_cache(kGpu);
  EXPECT_LT(memory_stats(kGpu).reserved_bytes, after.reserved_bytes);
}

// A block freed while another stream still uses it is not reused before that stream passes the
// free (storage.h's stream rule).
TEST(CudaAllocatorTest, BlockUsedByAnotherStreamWaitsForIt) {
  TESSEL_REQUIRE_CUDA();
  auto* caching = dynamic_cast<cuda::CachingAllocator*>(&allocator_for(kGpu));
  ASSERT_NE(caching, nullptr);
  const Stream a = create_stream(kGpu), b = create_stream(kGpu);
  void* first = nullptr;
  Tensor busy = randn({4096, 4096}, DType::kF32, kGpu);
  synchronize(kGpu);
  const int64_t pending_before = caching->cache_info(0).pending_blocks;
  {
    StreamGuard on_a(a);
    Tensor t = empty({1 << 20}, DType::kF32, kGpu);
    first = t.data_ptr();
    {
      StreamGuard on_b(b);  // b reads t after a long product
      Tensor w = matmul(busy, busy);
      for (int i = 0; i < 3; ++i) w = matmul(w, busy);
      copy_(t, narrow(reshape(w, {-1}), 0, 0, 1 << 20));
    }
    t.storage().record_stream(b);
  }  // t freed here, while b may still run
  const bool b_done = b.query();
  {
    StreamGuard on_a(a);
    Tensor again = empty({1 << 20}, DType::kF32, kGpu);
    if (!b_done) {
      EXPECT_NE(again.data_ptr(), first) << "reused while stream b still used it";
      EXPECT_EQ(caching->cache_info(0).pending_blocks, pending_before + 1);
    }
  }
  b.synchronize();
  {
    StreamGuard on_a(a);
    Tensor later = empty({1 << 20}, DType::kF32, kGpu);  // collects the completed free
    EXPECT_EQ(caching->cache_info(0).pending_blocks, pending_before);
  }
  synchronize(kGpu);
}

TEST(CudaAllocatorTest, OutOfMemoryNamesTheRequestAndTheState) {
  TESSEL_REQUIRE_CUDA();
  const int64_t failures = memory_stats(kGpu).failures;
  const std::string m =
      error_of<OutOfMemory>([] { empty({int64_t{1} << 45}, DType::kF32, kGpu); });  // 128 TiB
  expect_contains(m, "CUDA out of memory: cannot allocate");
  expect_contains(m, "140737488355328 bytes requested");
  expect_contains(m, "cuda:0 has");  // the device's free and total memory
  expect_contains(m, "allocator: allocated");
  EXPECT_EQ(memory_stats(kGpu).failures, failures + 1);
  Tensor fine = ones({16}, DType::kF32, kGpu);  // the device is still usable
  EXPECT_EQ(item(sum(fine)), 16.0);
}

// ---- Copies
// ---------------------------------------------------------------------------------------

TEST(CudaCopyTest, PinnedNonBlockingRoundTripAndDtypes) {
  TESSEL_REQUIRE_CUDA();
  ASSERT_TRUE(has_pinned_allocator());
  const Tensor host = pin_memory(arange(0.0, 100000.0, 1.0, DType::kF32));
  EXPECT_TRUE(host.is_pinned());
  const Tensor dev = to(host, kGpu, /*non_blocking=*/true);
  Tensor back = empty_pinned({100000});
  copy_(back, dev, /*non_blocking=*/true);
  current_stream(kGpu).synchronize();
  EXPECT_EQ(to_vector<float>(back), to_vector<float>(host));
  // Conversions on the device, then back.
  const Tensor bf = to(to(dev, DType::kBF16), Device::cpu());
  EXPECT_EQ(to_vector<float>(bf), to_vector<float>(to(host, DType::kBF16)));
  EXPECT_GT(pinned_memory_stats().allocated_bytes, 0);
}

// ---- Bad values found by kernels
// ------------------------------------------------------------------

TEST(CudaDeviceErrorTest, BadIndicesSurfaceAtTheNextSynchronisation) {
  TESSEL_REQUIRE_CUDA();
  const Tensor w = randn({10, 4}, DType::kF32, kGpu);
  const Tensor idx = to(from_vector<int64_t>({1, 12, 3}), kGpu);
  Tensor out = embedding(w, idx);  // asynchronous: no error yet
  const std::string m = error_of<OutOfRange>([] { synchronize(kGpu); });
  expect_contains(m, "embedding: index 12 at position 1 is out of range [0, 10)");
  synchronize(kGpu);  // reported once

  const Tensor logits = randn({3, 5}, DType::kF32, kGpu);
  const Tensor target = to(from_vector<int64_t>({0, -100, 7}), kGpu);
  const std::string ce = error_of<OutOfRange>([&] { item(cross_entropy(logits, target)); });
  expect_contains(ce, "cross_entropy target: index 7 at position 2 is out of range [0, 5)");
  EXPECT_EQ(item(sum(ones({4}, DType::kF32, kGpu))), 4.0);  // the device still works
}

// ---- Random numbers: the CPU's stream
// -------------------------------------------------------------

TEST(CudaRandomTest, DrawsAndDropoutMasksEqualTheCpusBitForBit) {
  TESSEL_REQUIRE_CUDA();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Generator cpu(1234), gpu(1234);
    EXPECT_EQ(to_vector<float>(rand({100003}, cpu, dtype)),
              to_vector<float>(rand({100003}, gpu, dtype, kGpu)));
    EXPECT_EQ(to_vector<float>(randn({100003}, cpu, dtype)),
              to_vector<float>(randn({100003}, gpu, dtype, kGpu)));
    const Tensor x = ones({257, 1031}, dtype);
    EXPECT_EQ(to_vector<float>(dropout(x, 0.1, true, &cpu)),
              to_vector<float>(dropout(to(x, kGpu), 0.1, true, &gpu)));
  }
}

}  // namespace
}  // namespace tessel
