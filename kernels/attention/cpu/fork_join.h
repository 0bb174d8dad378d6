#pragma once
// ForkJoin: runs a counted set of tasks, taken dynamically (so uneven tasks such as causal
// query blocks balance), on the tensor core's process-wide thread pool.

#include <cstdint>
#include <functional>

namespace tessel::kernels::attention {

// Thread-safety: run() may be called from several threads (the pool serialises jobs; a call
// made while the pool is busy runs inline on the caller). Owns no threads.
class ForkJoin {
 public:
  // `threads` <= 0 means the pool's thread count (tessel::num_threads()).
  explicit ForkJoin(int threads);

  int threads() const { return threads_; }

  // Calls fn(worker, task) once for every task in [0, tasks), worker in [0, threads()); no two
  // calls with the same worker run at once, so per-worker scratch needs no lock. Tasks are
  // taken in increasing order by whichever worker is free. Blocks until all tasks are done;
  // when a task throws, the remaining ones are skipped and the first exception is rethrown.
  void run(int64_t tasks, const std::function<void(int worker, int64_t task)>& fn) const;

 private:
  int threads_;
};

}  // namespace tessel::kernels::attention
