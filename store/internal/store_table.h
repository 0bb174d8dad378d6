#pragma once
// StoreTable: the data behind StoreServer — keys, values, and the blocking calls parked until
// their keys exist. Blocking calls do not hold a thread: a caller parks a StoreWaiter and gets
// finish() later, from the thread that set the last missing key, from the table's deadline
// thread when its timeout passes, or from stop(). Internal to store/internal (no gRPC types).

#include <condition_variable>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/mutex.h"
#include "tessel/store/store_server.h"

namespace tessel::internal {

// How a parked call ended.
enum class WaitEnd {
  kReady,    // every key exists; values are theirs (empty unless values were wanted)
  kTimeout,  // the timeout passed; values are the keys still missing
  kStopped,  // the table stopped; values are empty
};

// One parked blocking call. The table never owns it; its owner keeps it alive until finish()
// has been called or cancel() returned true.
class StoreWaiter {
 public:
  virtual ~StoreWaiter() = default;
  // Called exactly once, without the table's lock held, on some thread of the table's users or
  // on its deadline thread. Must not block.
  virtual void finish(WaitEnd end, std::vector<std::string> values) = 0;
};

// Thread-safe. Enforces StoreLimits: requests past a size limit throw InvalidArgument, a full
// table (max_keys, max_waiters) throws CommError; both name the limit and its value.
// Owns one thread (started by start(), joined by stop() and the destructor) that finishes
// waiters whose timeout passed.
class StoreTable {
 public:
  explicit StoreTable(StoreLimits limits);
  ~StoreTable();
  StoreTable(const StoreTable&) = delete;
  StoreTable& operator=(const StoreTable&) = delete;

  void start();
  // Finishes every parked waiter with kStopped, refuses later parks (PeerLost), joins the
  // deadline thread. Idempotent.
  void stop();

  const StoreLimits& limits() const { return limits_; }

  void set(const std::string& key, const std::string& value);
  int64_t add(const std::string& key, int64_t delta);
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired);
  bool check(const std::vector<std::string>& keys);
  bool delete_key(const std::string& key);
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);

  // The values of keys (empty when !want_values) if every key exists now; otherwise parks
  // waiter until they do or timeout passes, and returns nullopt: waiter->finish() follows.
  std::optional<std::vector<std::string>> get_or_park(const std::vector<std::string>& keys,
                                                      bool want_values, Nanoseconds timeout,
                                                      StoreWaiter* waiter);
  // Unparks waiter without finishing it (its call was cancelled). False when it was not parked
  // (already finished or being finished): finish() is then, or will be, called.
  bool cancel(StoreWaiter* waiter);

  StoreServerStats stats() const;

 private:
  struct Parked {
    std::vector<std::string> keys;
    bool want_values = false;
    std::multimap<SteadyClock::time_point, StoreWaiter*>::iterator deadline;
  };
  using Finished = std::vector<std::pair<StoreWaiter*, std::vector<std::string>>>;

  void check_key(const std::string& key) const;
  void check_key_count(size_t n, const char* what) const;
  void check_value(const std::string& key, const std::string& value) const;
  // Stores value (lock held), enforcing max_keys, and collects the waiters it completes.
  void put_locked(const std::string& key, const std::string& value, Finished& ready)
      TESSEL_REQUIRES(mutex_);
  bool all_present_locked(const std::vector<std::string>& keys) const TESSEL_REQUIRES(mutex_);
  std::vector<std::string> values_locked(const std::vector<std::string>& keys) const
      TESSEL_REQUIRES(mutex_);
  void unpark_locked(StoreWaiter* waiter, const Parked& parked) TESSEL_REQUIRES(mutex_);
  static void finish_all(Finished& finished, WaitEnd end);
  void run_deadlines();

  const StoreLimits limits_;
  mutable Mutex mutex_;
  std::condition_variable_any deadline_changed_;
  std::unordered_map<std::string, std::string> data_ TESSEL_GUARDED_BY(mutex_);
  std::unordered_map<StoreWaiter*, Parked> parked_ TESSEL_GUARDED_BY(mutex_);
  std::unordered_map<std::string, std::unordered_set<StoreWaiter*>> waiting_on_
      TESSEL_GUARDED_BY(mutex_);
  std::multimap<SteadyClock::time_point, StoreWaiter*> deadlines_ TESSEL_GUARDED_BY(mutex_);
  bool stopped_ TESSEL_GUARDED_BY(mutex_) = false;
  std::thread deadline_thread_;
};

// "'a', 'b'" — keys as they appear in messages (each shortened past 64 bytes; the first 16,
// then "and N more").
std::string quote_store_keys(const std::vector<std::string>& keys);

}  // namespace tessel::internal
