#pragma once
// The CPU thread pool behind tensor ops: parallel_for over an index range, and the process-wide
// thread count (set_num_threads, or TESSEL_NUM_THREADS; default one thread per hardware core).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tessel {

// A fixed set of worker threads that run the chunks of one parallel_for at a time; the calling
// thread works too. Thread-safe: concurrent parallel_for calls from different threads are
// serialised, and a call made while the pool is busy (or from inside a chunk) runs inline.
// Owns its workers: start() launches them, stop() (and the destructor) joins them.
//
// Idle workers spin for kSpin before they sleep, and so does a caller waiting for the last
// chunks: a training step issues hundreds of parallel ops back to back, and waking a sleeping
// thread costs 10-50 us each time (like OpenMP's spin-then-sleep wait policy).
class ThreadPool {
 public:
  ThreadPool() = default;
  ~ThreadPool() { stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Starts `threads - 1` workers (the caller is the last thread). threads >= 1.
  void start(int threads);
  // Joins the workers. Must not be called while a parallel_for runs.
  void stop();
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // How long an idle worker (or a waiting caller) polls before it blocks.
  static constexpr std::chrono::microseconds kSpin{100};

  // Runs fn(chunk_begin, chunk_end) over [begin, end) split into at most num_threads() chunks of
  // at least `grain` indices each; blocks until every chunk has run. The first exception thrown
  // by a chunk is rethrown here after all chunks finish. Chunk boundaries depend on the thread
  // count: kernels whose result must not (reductions) partition their work themselves.
  void parallel_for(int64_t begin, int64_t end, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn);

 private:
  // One parallel_for call. Workers hold it by shared_ptr, so a worker that wakes late only
  // finds its chunk counter exhausted and never touches a later call's state.
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t begin = 0, end = 0, chunk = 0, chunk_count = 0;
    std::atomic<int64_t> next_chunk{0};
    std::atomic<int64_t> chunks_left{0};  // reaches 0 under ThreadPool::mu_
    std::exception_ptr error;             // guarded by ThreadPool::mu_
  };

  void worker_loop();
  void run_chunks(Job& job);

  std::vector<std::thread> workers_;
  std::mutex submit_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Written under mu_, read without it while spinning.
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};  // bumped per job, workers wake on change
  std::shared_ptr<Job> job_;             // guarded by mu_; the latest job
};

// The process-wide pool's thread count (>= 1). First use takes default_num_threads().
int num_threads();
// What the pool starts with: TESSEL_NUM_THREADS when positive, else OMP_NUM_THREADS's first
// value when positive (tessel-run, like torchrun, sets it to 1 for several workers per node, so
// they do not oversubscribe the cores), else one thread per hardware core.
int default_num_threads();
// Sets the thread count for tensor ops and GEMM; n <= 0 means one per hardware core.
// Not to be called while ops run on other threads.
void set_num_threads(int n);
// parallel_for on the process-wide pool (see ThreadPool::parallel_for).
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace tessel
