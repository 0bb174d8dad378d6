#include "tessel/kernels/attention/cpu/fork_join.h"

#include <algorithm>
#include <atomic>

#include "tessel/tensor/thread_pool.h"

namespace tessel::kernels::attention {

ForkJoin::ForkJoin(int threads) : threads_(threads > 0 ? threads : num_threads()) {}

void ForkJoin::run(int64_t tasks, const std::function<void(int, int64_t)>& fn) const {
  if (tasks <= 0) return;
  const int64_t team = std::min<int64_t>(threads_, tasks);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  // One pool chunk per worker index; each worker drains the shared task counter. The pool
  // rethrows the first exception after every chunk has finished.
  parallel_for(0, team, 1, [&](int64_t first, int64_t last) {
    for (int64_t worker = first; worker < last; ++worker) {
      for (;;) {
        const int64_t task = next.fetch_add(1, std::memory_order_relaxed);
        if (task >= tasks || failed.load(std::memory_order_relaxed)) break;
        try {
          fn(static_cast<int>(worker), task);
        } catch (...) {
          failed = true;
          throw;
        }
      }
    }
  });
}

}  // namespace tessel::kernels::attention
