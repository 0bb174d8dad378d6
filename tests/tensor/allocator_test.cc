// The CPU allocator: reuse of large blocks by exact size and of the latest freed mid-sized ones,
// alignment, cache release, and the memory statistics (allocated, reserved, peaks) that tests
// and benchmarks read.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

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

// Blocks of 64 KiB up to 1 MiB: the latest freed are kept, 4 MiB of them at most, the oldest
// given back first; a block of the size just freed is that block again.
TEST(CpuAllocatorTest, KeepsTheLatestFreedMidSizedBlocks) {
  Allocator& a = cpu_allocator();
  const Stream s;
  empty_cache(Device::cpu());
  const int64_t reserved = memory_stats(Device::cpu()).reserved_bytes;
  auto reserved_now = [&] { return memory_stats(Device::cpu()).reserved_bytes - reserved; };
  const size_t kept = size_t{512} << 10;
  void* p = a.allocate(kept, s);
  a.deallocate(p, kept);
  EXPECT_EQ(reserved_now(), static_cast<int64_t>(kept));
  EXPECT_EQ(a.allocate(kept, s), p);
  a.deallocate(p, kept);
  const size_t below = (size_t{64} << 10) - 64;  // not kept
  a.deallocate(a.allocate(below, s), below);
  EXPECT_EQ(reserved_now(), static_cast<int64_t>(kept));
  // Five blocks of 960 KiB freed in turn (p's 512 KiB before them): 4 MiB holds the last four.
  const size_t block = size_t{960} << 10;
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(a.allocate(block, s));
  for (void* b : blocks) a.deallocate(b, block);
  EXPECT_EQ(reserved_now(), static_cast<int64_t>(4 * block));
  for (int i = 4; i >= 1; --i) EXPECT_EQ(a.allocate(block, s), blocks[static_cast<size_t>(i)]);
  EXPECT_EQ(reserved_now(), static_cast<int64_t>(4 * block));
  for (int i = 1; i <= 4; ++i) a.deallocate(blocks[static_cast<size_t>(i)], block);
  empty_cache(Device::cpu());
  EXPECT_EQ(reserved_now(), 0);
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
