// Planted for ThreadSafetyTest: locking mistakes that clang's -Wthread-safety must reject, each
// on a line marked "violation". Never built; if this file compiles clean, the check is broken.

#include <condition_variable>

#include "tessel/base/mutex.h"

namespace tessel {
namespace {

class Counter {
 public:
  void add() {
    MutexLock lock(mutex_);
    add_locked();
  }
  int read_unlocked() const { return count_; }  // violation: reads without the lock
  void add_unlocked() { add_locked(); }         // violation: a _locked helper without the lock
  void wait_and_write() {
    MutexLock lock(mutex_);
    changed_.wait(lock, [&]() TESSEL_REQUIRES(mutex_) { return count_ > 0; });
    lock.unlock();
    count_ = 0;  // violation: writes after unlocking a relockable scope
  }

 private:
  void add_locked() TESSEL_REQUIRES(mutex_) { ++count_; }

  mutable Mutex mutex_;
  std::condition_variable_any changed_;
  int count_ TESSEL_GUARDED_BY(mutex_) = 0;
};

}  // namespace
}  // namespace tessel
