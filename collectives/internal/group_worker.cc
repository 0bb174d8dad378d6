#include "tessel/collectives/internal/group_worker.h"

#include <pthread.h>

#include <chrono>

namespace tessel::internal {

void GroupWorker::enqueue(std::function<void()> task) {
  {
    MutexLock lock(mutex_);
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
}

bool GroupWorker::try_begin_inline() {
  MutexLock lock(mutex_);
  if (busy_ || !queue_.empty()) return false;
  busy_ = true;
  return true;
}

void GroupWorker::end_inline() {
  {
    MutexLock lock(mutex_);
    busy_ = false;
  }
  cv_.notify_all();
}

void GroupWorker::stop() {
  std::thread thread;
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  cv_.notify_all();
  if (thread.joinable()) thread.join();
}

void GroupWorker::run() {
  const std::string thread_name = ("pg:" + name_).substr(0, 15);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  MutexLock lock(mutex_);
  for (;;) {
    // Tasks must wait for an inline call in progress so issue order is kept.
    // Bounded waits: an idle worker re-checks once a second.
    const bool ready = cv_.wait_for(lock, std::chrono::seconds(1), [&]() TESSEL_REQUIRES(mutex_) {
      return (!queue_.empty() && !busy_) || (stopping_ && queue_.empty());
    });
    if (!ready) continue;
    if (queue_.empty()) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    task();  // tasks catch their own errors
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace tessel::internal
