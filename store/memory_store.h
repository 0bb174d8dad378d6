#pragma once
// MemoryStore: a Store held in this process's memory, for ranks that are threads (the threads
// backend, tests) and as the data structure behind the gRPC store server.

#include <condition_variable>
#include <map>

#include "tessel/base/mutex.h"
#include "tessel/store/store.h"

namespace tessel {

// Thread-safe. Blocking calls wait on a condition variable with the caller's deadline.
class MemoryStore final : public Store {
 public:
  explicit MemoryStore(Nanoseconds default_timeout = std::chrono::seconds(300))
      : Store(default_timeout) {}

  void set(const std::string& key, const std::string& value) override;
  using Store::get;
  std::string get(const std::string& key, Nanoseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Nanoseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  using Store::multi_get;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     Nanoseconds timeout) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;

  size_t size() const;

 private:
  // Waits (lock held) until every key exists; throws Timeout naming the missing ones.
  void wait_locked(MutexLock& lock, const std::vector<std::string>& keys, Nanoseconds timeout)
      TESSEL_REQUIRES(mutex_);

  mutable Mutex mutex_;
  std::condition_variable_any changed_;
  std::map<std::string, std::string> data_ TESSEL_GUARDED_BY(mutex_);
};

// Parses a store counter value (decimal int64); throws InvalidArgument naming key and value.
// value + delta for add(); throws InvalidArgument naming the key when it would overflow int64.
int64_t add_store_counter(const std::string& key, int64_t value, int64_t delta);
int64_t parse_store_counter(const std::string& key, const std::string& value);

}  // namespace tessel
