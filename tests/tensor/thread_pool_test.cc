// ThreadPool: covers every index once, nests, propagates exceptions.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "tessel/tensor/thread_pool.h"

namespace tessel {
namespace {

TEST(ThreadPoolTest, CoversEachIndexOnce_OddCounts) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool;
    pool.start(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 7, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(0, n, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool;
  pool.start(2);
  std::atomic<int64_t> total{0};
  pool.parallel_for(0, 4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(0, 10, 1, [&](int64_t ib, int64_t ie) { total += ie - ib; });
    }
  });
  EXPECT_EQ(total.load(), 40);
}

TEST(ThreadPoolTest, RethrowsChunkException) {
  ThreadPool pool;
  pool.start(3);
  EXPECT_THROW(pool.parallel_for(0, 100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b == 0) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
  int64_t count = 0;  // still usable afterwards
  pool.parallel_for(0, 5, 10, [&](int64_t b, int64_t e) { count += e - b; });
  EXPECT_EQ(count, 5);
}

TEST(ThreadPoolTest, SetNumThreads) {
  const int before = num_threads();
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(before);
  EXPECT_EQ(num_threads(), before);
}

}  // namespace
}  // namespace tessel
