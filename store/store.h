#pragma once
// Store: the job's key-value service for rendezvous and for bootstrapping backends (Gloo's and
// NCCL's unique ids, barriers). Implementations: MemoryStore (one process: threads backend,
// tests), the gRPC client (store/store_client.h), PrefixStore (a namespace for a sub-group).
//
// Keys are strings; values are byte strings. Blocking calls take a timeout (the store's default
// when omitted) and throw Timeout naming the keys that never appeared. All methods are
// thread-safe.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/base/clock.h"

namespace tessel {

class Store {
 public:
  explicit Store(Nanoseconds default_timeout = std::chrono::seconds(300))
      : default_timeout_(default_timeout.count()) {}
  // Out of line (store.cc): the key function, so Store's type information lives in one library.
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Nanoseconds timeout() const { return Nanoseconds(default_timeout_.load()); }
  void set_timeout(Nanoseconds timeout) { default_timeout_.store(timeout.count()); }

  // Stores value under key, replacing any value; wakes waiters on key.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value under key, waiting until it is set. Throws Timeout.
  std::string get(const std::string& key) { return get(key, timeout()); }
  virtual std::string get(const std::string& key, Nanoseconds timeout) = 0;
  // Adds delta to the integer under key (created as 0) and returns the new value. Throws
  // InvalidArgument when the key holds something that is not a decimal integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to desired if its value equals expected (a missing key matches an empty expected)
  // and returns the value held afterwards (desired on success, the current value otherwise).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // Waits until every key exists. Throws Timeout naming the missing ones.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, Nanoseconds timeout) = 0;
  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes key; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Values of all keys, waiting for each as get() does.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) {
    return multi_get(keys, timeout());
  }
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                             Nanoseconds timeout) = 0;
  // Sets every keys[i] to values[i] at once. Throws InvalidArgument on a length mismatch.
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) = 0;

 private:
  std::atomic<Nanoseconds::rep> default_timeout_;
};

// A view of another store in which every key is "<prefix>/<key>": sub-groups get their own
// namespace on the job's store. Shares ownership of the underlying store.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  const std::string& prefix() const { return prefix_; }
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

 private:
  std::string key_of(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> keys_of(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace tessel
