#include "tessel/tensor/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "tessel/base/env.h"
#include "tessel/base/error.h"

namespace tessel {
namespace {

thread_local bool t_inside_chunk = false;

// Marks the current thread as running a chunk so nested parallel_for calls run inline.
class ChunkScope {
 public:
  ChunkScope() : previous_(t_inside_chunk) { t_inside_chunk = true; }
  ~ChunkScope() { t_inside_chunk = previous_; }

 private:
  bool previous_;
};

int resolve_threads(int n) {
  if (n > 0) return n;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

void ThreadPool::start(int threads) {
  TESSEL_CHECK(threads >= 1, InvalidArgument, "thread pool needs at least 1 thread, got {}",
               threads);
  stop();
  stopping_ = false;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void ThreadPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void ThreadPool::run_chunks() {
  ChunkScope scope;
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= chunk_count_) return;
    const int64_t b = begin_ + c * chunk_;
    const int64_t e = std::min(end_, b + chunk_);
    std::exception_ptr error;
    try {
      (*fn_)(b, e);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (error && !error_) error_ = error;
    if (--chunks_left_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_chunks();
  }
}

void ThreadPool::parallel_for(int64_t begin, int64_t end, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  std::unique_lock<std::mutex> submit(submit_mu_, std::try_to_lock);
  if (chunks <= 1 || t_inside_chunk || !submit.owns_lock()) {
    fn(begin, end);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    begin_ = begin;
    end_ = end;
    chunk_ = (n + chunks - 1) / chunks;
    chunk_count_ = (n + chunk_ - 1) / chunk_;
    chunks_left_ = chunk_count_;
    next_chunk_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    ++generation_;
  }
  work_cv_.notify_all();
  run_chunks();
  std::exception_ptr error;
  {
    // Compute chunks have no deadline of their own; wake periodically rather than wait blind.
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_cv_.wait_for(lock, std::chrono::milliseconds(100),
                              [&] { return chunks_left_ == 0; })) {
    }
    error = error_;
    fn_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

namespace {

std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;  // created on first use

ThreadPool& global_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) {
    g_pool = std::make_unique<ThreadPool>();
    g_pool->start(resolve_threads(static_cast<int>(env_int(EnvKnob::kNumThreads))));
  }
  return *g_pool;
}

}  // namespace

int num_threads() { return global_pool().num_threads(); }

void set_num_threads(int n) {
  ThreadPool& pool = global_pool();
  std::lock_guard<std::mutex> lock(g_pool_mu);
  pool.start(resolve_threads(n));
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  global_pool().parallel_for(begin, end, grain, fn);
}

}  // namespace tessel
