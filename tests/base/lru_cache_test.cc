// The bounded least-recently-used cache (base/lru_cache.h) behind the cuDNN SDPA graphs and the
// CUDA matmul's cuBLASLt setups.
#include "tessel/base/lru_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace tessel {
namespace {

TEST(LruCacheTest, StaysWithinItsCapacityAndForgetsTheLeastRecentlyUsed) {
  LruCache<int, std::string> cache(3);
  cache.insert(1, "one");
  cache.insert(2, "two");
  cache.insert(3, "three");
  cache.insert(4, "four");  // evicts 1, then 2, in insertion order
  cache.insert(5, "five");
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.counts().evictions, 2);
  EXPECT_EQ(cache.find(1), nullptr);
  EXPECT_EQ(cache.find(2), nullptr);
  for (int k : {3, 4, 5}) EXPECT_NE(cache.find(k), nullptr) << k;
}

TEST(LruCacheTest, AHitMakesAnEntryTheMostRecentlyUsed) {
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

TEST(LruCacheTest, InsertKeepsAnExistingValueAndRefreshesIt) {
  LruCache<int, std::string> cache(2);
  cache.insert(7, "first");
  cache.insert(8, "eight");
  EXPECT_EQ(cache.insert(7, "second"), "first");  // 7 is now more recent than 8
  EXPECT_EQ(cache.size(), 2u);
  cache.insert(9, "nine");  // evicts 8
  EXPECT_EQ(cache.find(8), nullptr);
  ASSERT_NE(cache.find(7), nullptr);
  EXPECT_EQ(*cache.find(7), "first");
}

TEST(LruCacheTest, CapacityOneKeepsTheLastKey_ZeroIsTakenAsOne) {
  for (size_t capacity : {size_t{1}, size_t{0}}) {
    LruCache<int, int> cache(capacity);
    EXPECT_EQ(cache.capacity(), 1u);
    cache.insert(1, 10);
    EXPECT_EQ(*cache.find(1), 10);
    cache.insert(2, 20);
    EXPECT_EQ(cache.size(), 1u);
    EXPECT_EQ(cache.find(1), nullptr);
    EXPECT_EQ(*cache.find(2), 20);
    EXPECT_EQ(cache.counts().evictions, 1);
  }
}

TEST(LruCacheTest, EraseForgetsOneKeyAndFreesItsSlot) {
  LruCache<int, std::unique_ptr<int>> cache(2);  // move-only values
  cache.insert(1, std::make_unique<int>(1));
  cache.insert(2, std::make_unique<int>(2));
  EXPECT_TRUE(cache.erase(1));
  EXPECT_FALSE(cache.erase(1));
  EXPECT_FALSE(cache.erase(42));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.find(1), nullptr);
  cache.insert(3, std::make_unique<int>(3));  // fits without evicting 2
  EXPECT_EQ(cache.counts().evictions, 0);
  EXPECT_EQ(**cache.find(2), 2);
  EXPECT_EQ(**cache.find(3), 3);
}

TEST(LruCacheTest, CountsHitsAndMisses_InsertCountsNeither) {
  LruCache<int, int> cache(4);
  EXPECT_EQ(cache.find(1), nullptr);
  cache.insert(1, 1);
  cache.insert(1, 2);
  EXPECT_NE(cache.find(1), nullptr);
  EXPECT_NE(cache.find(1), nullptr);
  EXPECT_EQ(cache.counts().misses, 1);
  EXPECT_EQ(cache.counts().hits, 2);
  EXPECT_EQ(cache.counts().evictions, 0);
}

struct VectorHash {
  size_t operator()(const std::vector<int>& v) const {
    size_t h = 0;
    for (int x : v) h = h * 31 + static_cast<size_t>(x);
    return h;
  }
};

TEST(LruCacheTest, HashedKeysEvictInTheSameOrder) {
  LruCache<std::vector<int>, int, VectorHash> cache(2);
  cache.insert({1, 2}, 1);
  cache.insert({3}, 2);
  ASSERT_NE(cache.find({1, 2}), nullptr);
  cache.insert({4, 5, 6}, 3);  // evicts {3}
  EXPECT_EQ(cache.find({3}), nullptr);
  EXPECT_EQ(*cache.find({1, 2}), 1);
  EXPECT_EQ(*cache.find({4, 5, 6}), 3);
}

TEST(LruCacheTest, ManyShapesNeverGrowIt) {
  LruCache<int, int> cache(64);
  for (int seq = 1; seq <= 10000; ++seq) cache.insert(seq, seq);
  EXPECT_EQ(cache.size(), 64u);
  EXPECT_NE(cache.find(10000), nullptr);
  EXPECT_EQ(cache.find(1), nullptr);
}

}  // namespace
}  // namespace tessel
