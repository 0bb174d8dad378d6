#pragma once
// ForkJoin: runs a counted set of tasks on a team of threads that exists only for the call.
// flash_cpu uses it until the tensor core's shared thread pool is merged.

#include <cstdint>
#include <functional>

namespace tessel::attention {

// Thread-safety: run() may be called from several threads at once (each call has its own team).
// Ownership: the worker threads are started and joined inside run(); none outlives it.
class ForkJoin {
 public:
  // `threads` <= 0 means std::thread::hardware_concurrency().
  explicit ForkJoin(int threads);

  int threads() const { return threads_; }

  // Calls fn(worker, task) once for every task in [0, tasks), worker in [0, threads()),
  // tasks taken in increasing order by whichever worker is free; the calling thread is worker
  // 0. Blocks until all tasks are done. When a task throws, the remaining tasks are skipped
  // and the first exception is rethrown here.
  void run(int64_t tasks, const std::function<void(int worker, int64_t task)>& fn) const;

 private:
  int threads_;
};

}  // namespace tessel::attention
