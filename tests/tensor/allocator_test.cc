// The CPU allocator: reuse of large blocks by exact size, alignment, cache release, and the
// memory statistics (allocated, reserved, peaks) that tests and benchmarks read.
#include <gtest/gtest.h>

#include <cstdint>

#include "tessel/base/error.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/tensor.h"

namespace tessel {
namespace {

TEST(CpuAllocatorTest, ReusesLargeBlocksOfTheSameSize) {
  Allocator& a = cpu_allocator();
  const Stream s;
  const size_t big = size_t{3} << 20;
  void* p = a.allocate(big, s);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  a.deallocate(p, big);
  void* q = a.allocate(big, s);
  EXPECT_EQ(q, p);  // served from the cache
  void* r = a.allocate(big, s);
  EXPECT_NE(r, q);  // the cached block is in use: a fresh one
  a.deallocate(q, big);
  a.deallocate(r, big);
  empty_cache(Device::cpu());
  void* small = a.allocate(100, s);  // small blocks bypass the cache
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  a.deallocate(small, 100);
  void* zero = a.allocate(0, s);
  EXPECT_NE(zero, nullptr);
  a.deallocate(zero, 0);
}

// Per-call buffers of collectives (a 512 KiB result, say) are cached from 64 KiB: glibc would
// hand them back when they end its heap and fault their pages in again.
TEST(CpuAllocatorTest, CachesBlocksFrom64KiB) {
  Allocator& a = cpu_allocator();
  const Stream s;
  empty_cache(Device::cpu());
  const int64_t reserved = memory_stats(Device::cpu()).reserved_bytes;
  const size_t cached = size_t{64} << 10, not_cached = cached - 64;
  void* p = a.allocate(cached, s);
  a.deallocate(p, cached);
  EXPECT_EQ(memory_stats(Device::cpu()).reserved_bytes, reserved + static_cast<int64_t>(cached));
  EXPECT_EQ(a.allocate(cached, s), p);
  a.deallocate(p, cached);
  void* q = a.allocate(not_cached, s);
  a.deallocate(q, not_cached);
  EXPECT_EQ(memory_stats(Device::cpu()).reserved_bytes, reserved + static_cast<int64_t>(cached));
  empty_cache(Device::cpu());
  EXPECT_EQ(memory_stats(Device::cpu()).reserved_bytes, reserved);
}

TEST(CpuAllocatorTest, StatisticsFollowAllocationsCacheAndPeaks) {
  empty_cache(Device::cpu());
  reset_peak_memory_stats(Device::cpu());
  const MemoryStats before = memory_stats(Device::cpu());
  const int64_t mib = int64_t{1} << 20;
  {
    Tensor a = empty({4 * mib / 4}, DType::kF32);  // 4 MiB
    Tensor b = empty({1000}, DType::kF32);         // 4000 bytes -> a 4032-byte block
    const MemoryStats during = memory_stats(Device::cpu());
    EXPECT_EQ(during.allocated_bytes - before.allocated_bytes, 4 * mib + 4032);
    EXPECT_EQ(during.reserved_bytes - before.reserved_bytes, 4 * mib + 4032);
    EXPECT_EQ(during.allocations - before.allocations, 2);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
  }
  // The large block went to the cache: no longer allocated, still reserved.
  const MemoryStats after = memory_stats(Device::cpu());
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes - before.reserved_bytes, 4 * mib);
  EXPECT_EQ(after.frees - before.frees, 2);
  EXPECT_EQ(after.peak_allocated_bytes - before.allocated_bytes, 4 * mib + 4032);
  empty_cache(Device::cpu());
  EXPECT_EQ(memory_stats(Device::cpu()).reserved_bytes, before.reserved_bytes);
  reset_peak_memory_stats(Device::cpu());
  EXPECT_EQ(memory_stats(Device::cpu()).peak_allocated_bytes,
            memory_stats(Device::cpu()).allocated_bytes);
}

TEST(CpuAllocatorTest, StatisticsTextNamesBothFigures) {
  MemoryStats s;
  s.allocated_bytes = 3 << 20;
  s.peak_allocated_bytes = 5 << 20;
  s.reserved_bytes = 6 << 20;
  s.peak_reserved_bytes = 6 << 20;
  EXPECT_EQ(s.str(), "allocated 3.0 MiB (peak 5.0 MiB), reserved 6.0 MiB (peak 6.0 MiB)");
}

TEST(PinnedMemoryTest, NeedsADeviceBackendThatProvidesIt) {
  if (has_pinned_allocator()) GTEST_SKIP() << "this build has a pinned allocator";
  try {
    empty_pinned({4});
    FAIL() << "expected Unavailable";
  } catch (const Unavailable& e) {
    EXPECT_NE(std::string(e.what()).find("pinned host memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
