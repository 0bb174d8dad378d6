#include "tessel/kernels/attention/cpu/fork_join.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tessel::attention {

ForkJoin::ForkJoin(int threads)
    : threads_(threads > 0 ? threads
                           : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}

void ForkJoin::run(int64_t tasks, const std::function<void(int, int64_t)>& fn) const {
  if (tasks <= 0) return;
  const int team = static_cast<int>(std::min<int64_t>(threads_, tasks));
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto work = [&](int worker) {
    for (;;) {
      const int64_t task = next.fetch_add(1, std::memory_order_relaxed);
      if (task >= tasks || failed.load(std::memory_order_relaxed)) return;
      try {
        fn(worker, task);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
        return;
      }
    }
  };
  {
    std::vector<std::jthread> helpers;
    helpers.reserve(team - 1);
    for (int w = 1; w < team; ++w) helpers.emplace_back(work, w);
    work(0);
  }  // jthreads join here
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace tessel::attention
