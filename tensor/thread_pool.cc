#include "tessel/tensor/thread_pool.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string_view>

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

// Polls `done` for up to ThreadPool::kSpin; true when it became true.
template <typename Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + ThreadPool::kSpin;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

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

void ThreadPool::run_chunks(Job& job) {
  ChunkScope scope;
  for (;;) {
    const int64_t c = job.next_chunk.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.chunk_count) return;
    const int64_t b = job.begin + c * job.chunk;
    const int64_t e = std::min(job.end, b + job.chunk);
    std::exception_ptr error;
    try {
      (*job.fn)(b, e);
    } catch (...) {
      error = std::current_exception();
    }
    if (error) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!job.error) job.error = error;
    }
    if (job.chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // so a caller about to sleep sees it or the notify
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    spin_until([&] {
      return stopping_.load(std::memory_order_relaxed) ||
             generation_.load(std::memory_order_acquire) != seen;
    });
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle until there is work; the timeout only bounds each wait (no deadline applies).
      while (!work_cv_.wait_for(lock, std::chrono::seconds(1),
                                [&] { return stopping_ || generation_ != seen; })) {
      }
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    if (job) run_chunks(*job);  // null when the job finished before this worker woke
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
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->begin = begin;
  job->end = end;
  job->chunk = (n + chunks - 1) / chunks;
  job->chunk_count = (n + job->chunk - 1) / job->chunk;
  job->chunks_left = job->chunk_count;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    ++generation_;
  }
  work_cv_.notify_all();
  run_chunks(*job);
  spin_until([&] { return job->chunks_left.load(std::memory_order_acquire) == 0; });
  std::exception_ptr error;
  {
    // Compute chunks have no deadline of their own; wake periodically rather than wait blind.
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_cv_.wait_for(lock, std::chrono::milliseconds(100),
                              [&] { return job->chunks_left == 0; })) {
    }
    error = job->error;
    job_.reset();
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
    g_pool->start(default_num_threads());
  }
  return *g_pool;
}

}  // namespace

int default_num_threads() {
  const auto ours = env_int(EnvKnob::kNumThreads);
  if (ours > 0) return static_cast<int>(ours);
  // OpenMP's variable may list one count per nesting level ("4,2"): the first is ours.
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr) {
    const std::string_view text(omp);
    int value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc() && value > 0 && (end == text.data() + text.size() || *end == ',')) {
      return value;
    }
  }
  return resolve_threads(0);
}

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
