// The bounded cache behind the cuDNN SDPA graphs (kernels/attention/internal/lru_cache.h).
#include "tessel/kernels/attention/internal/lru_cache.h"

#include <gtest/gtest.h>

#include <string>

namespace tessel::kernels::attention {
namespace {

TEST(LruCacheTest, StaysWithinItsCapacityAndForgetsTheLeastRecentlyUsed) {
  LruCache<int, std::string> cache(2);
  cache.insert(1, "one");
  cache.insert(2, "two");
  ASSERT_NE(cache.find(1), nullptr);  // 1 is now more recent than 2
  cache.insert(3, "three");           // evicts 2
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find(2), nullptr);
  ASSERT_NE(cache.find(1), nullptr);
  EXPECT_EQ(*cache.find(1), "one");
  EXPECT_EQ(*cache.find(3), "three");
}

TEST(LruCacheTest, InsertKeepsAnExistingValue) {
  LruCache<int, std::string> cache(4);
  cache.insert(7, "first");
  EXPECT_EQ(cache.insert(7, "second"), "first");
  EXPECT_EQ(cache.size(), 1u);
}

TEST(LruCacheTest, ManyShapesNeverGrowIt) {
  LruCache<int, int> cache(64);
  for (int seq = 1; seq <= 10000; ++seq) cache.insert(seq, seq);
  EXPECT_EQ(cache.size(), 64u);
  EXPECT_NE(cache.find(10000), nullptr);
  EXPECT_EQ(cache.find(1), nullptr);
}

}  // namespace
}  // namespace tessel::kernels::attention
