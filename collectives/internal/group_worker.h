#pragma once
// GroupWorker: the thread that runs one process group's queued operations in issue order.
// Callers either hand it a task (enqueue) or, when nothing is queued or running, run their
// operation on their own thread (try_begin_inline / end_inline) so a blocking call pays no
// thread hand-off.
//
// Thread-safety: all methods are thread-safe. Ownership: owned by its ProcessGroup; the thread
// starts on first enqueue and is joined by stop() / the destructor after the queue drains.

#include <condition_variable>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "tessel/base/mutex.h"

namespace tessel::internal {

class GroupWorker {
 public:
  explicit GroupWorker(std::string name) : name_(std::move(name)) {}
  ~GroupWorker() { stop(); }
  GroupWorker(const GroupWorker&) = delete;
  GroupWorker& operator=(const GroupWorker&) = delete;

  // Queues a task behind everything queued or running. Never blocks on the task.
  void enqueue(std::function<void()> task);
  // True (and the caller now owns the execution slot) when nothing is queued or running.
  bool try_begin_inline();
  void end_inline();
  // Runs the queued tasks, then joins the thread. Idempotent.
  void stop();

 private:
  void run();

  const std::string name_;
  Mutex mutex_;
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> queue_ TESSEL_GUARDED_BY(mutex_);
  bool busy_ TESSEL_GUARDED_BY(mutex_) = false;  // a task or an inline call is running
  bool stopping_ TESSEL_GUARDED_BY(mutex_) = false;
  std::thread thread_ TESSEL_GUARDED_BY(mutex_);
};

}  // namespace tessel::internal
