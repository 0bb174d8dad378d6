#pragma once
// Mutex and MutexLock: std::mutex and a scoped lock over it, annotated so that clang's
// -Wthread-safety checks the data they guard (thread_annotations.h).

#include <mutex>

#include "tessel/base/thread_annotations.h"

namespace tessel {

// A std::mutex the analysis knows as a lock. Not recursive. Thread-safe; not copyable or
// movable.
class TESSEL_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() TESSEL_ACQUIRE() { mutex_.lock(); }
  void unlock() TESSEL_RELEASE() { mutex_.unlock(); }
  bool try_lock() TESSEL_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  std::mutex mutex_;
};

// Holds a Mutex for its scope. It is also BasicLockable (lock()/unlock() drop and retake the
// mutex inside the scope), so std::condition_variable_any can wait on it:
//
//   MutexLock lock(mutex_);
//   changed_.wait_until(lock, deadline);   // changed_ is a std::condition_variable_any
//
// Used by one thread; the Mutex must outlive it.
class TESSEL_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) TESSEL_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  // Unlocks the mutex if this scope holds it.
  ~MutexLock() TESSEL_RELEASE() {
    if (locked_) mutex_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() TESSEL_ACQUIRE() {
    mutex_.lock();
    locked_ = true;
  }
  void unlock() TESSEL_RELEASE() {
    mutex_.unlock();
    locked_ = false;
  }

 private:
  Mutex& mutex_;
  bool locked_ = true;
};

}  // namespace tessel
