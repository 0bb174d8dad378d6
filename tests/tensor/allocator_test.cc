// The CPU allocator's cache of large blocks: reuse by exact size, alignment, release.
#include <gtest/gtest.h>

#include <cstdint>

#include "tessel/tensor/storage.h"

namespace tessel {
namespace {

TEST(CpuAllocatorTest, ReusesLargeBlocksOfTheSameSize) {
  Allocator& a = cpu_allocator();
  const size_t big = size_t{3} << 20;
  void* p = a.allocate(big);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  a.deallocate(p, big);
  void* q = a.allocate(big);
  EXPECT_EQ(q, p);  // served from the cache
  void* r = a.allocate(big);
  EXPECT_NE(r, q);  // the cached block is in use: a fresh one
  a.deallocate(q, big);
  a.deallocate(r, big);
  release_cpu_allocator_cache();
  void* small = a.allocate(100);  // small blocks bypass the cache
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  a.deallocate(small, 100);
  void* zero = a.allocate(0);
  EXPECT_NE(zero, nullptr);
  a.deallocate(zero, 0);
}

}  // namespace
}  // namespace tessel
