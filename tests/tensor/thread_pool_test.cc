// ThreadPool: covers every index once, nests, propagates exceptions; its default size.
#include "tessel/tensor/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

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

// The pool's default: TESSEL_NUM_THREADS, else OMP_NUM_THREADS (what tessel-run and torchrun set
// for several workers per node), else the hardware's cores.
TEST(ThreadPoolTest, DefaultFollowsTesselThenOpenMpVariables) {
  const char* saved_ours = std::getenv("TESSEL_NUM_THREADS");
  const char* saved_omp = std::getenv("OMP_NUM_THREADS");
  const std::string ours = saved_ours ? saved_ours : "", omp = saved_omp ? saved_omp : "";
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  unsetenv("TESSEL_NUM_THREADS");
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(default_num_threads(), hardware);
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(default_num_threads(), 3);
  setenv("OMP_NUM_THREADS", "5,2", 1);  // one count per nesting level: the first
  EXPECT_EQ(default_num_threads(), 5);
  setenv("OMP_NUM_THREADS", "lots", 1);  // not a count: ignored, as OpenMP would
  EXPECT_EQ(default_num_threads(), hardware);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("TESSEL_NUM_THREADS", "2", 1);  // ours wins
  EXPECT_EQ(default_num_threads(), 2);
  setenv("TESSEL_NUM_THREADS", "0", 1);  // 0: not set
  EXPECT_EQ(default_num_threads(), 1);
  auto restore = [](const char* name, const char* saved, const std::string& value) {
    if (saved) {
      setenv(name, value.c_str(), 1);
    } else {
      unsetenv(name);
    }
  };
  restore("TESSEL_NUM_THREADS", saved_ours, ours);
  restore("OMP_NUM_THREADS", saved_omp, omp);
}

}  // namespace
}  // namespace tessel
