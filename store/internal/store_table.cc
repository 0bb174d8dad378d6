#include "tessel/store/internal/store_table.h"

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/store/memory_store.h"

namespace tessel::internal {
namespace {

// Timeouts past this are treated as this long, so deadlines never overflow the clock.
constexpr Nanoseconds kLongestWait = std::chrono::hours(24 * 365);
// The deadline thread re-checks at least this often even with nothing due.
constexpr Nanoseconds kIdleTick = std::chrono::seconds(1);

std::string shorten(const std::string& key) {
  return key.size() > 64 ? key.substr(0, 64) + "..." : key;
}

}  // namespace

std::string quote_store_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 16;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) {
    out += (out.empty() ? "'" : ", '") + shorten(keys[i]) + "'";
  }
  if (keys.size() > kShown) out += fmt::format(" and {} more", keys.size() - kShown);
  return out;
}

StoreTable::StoreTable(StoreLimits limits) : limits_(limits) {}

StoreTable::~StoreTable() { stop(); }

void StoreTable::start() {
  MutexLock lock(mutex_);
  TESSEL_CHECK(!stopped_ && !deadline_thread_.joinable(), Internal,
               "StoreTable::start called twice or after stop");
  deadline_thread_ = std::thread([this] { run_deadlines(); });
}

void StoreTable::stop() {
  Finished stopped;
  {
    MutexLock lock(mutex_);
    stopped_ = true;
    for (auto& [waiter, parked] : parked_) stopped.emplace_back(waiter, std::vector<std::string>());
    parked_.clear();
    waiting_on_.clear();
    deadlines_.clear();
  }
  deadline_changed_.notify_all();
  finish_all(stopped, WaitEnd::kStopped);
  if (deadline_thread_.joinable() && deadline_thread_.get_id() != std::this_thread::get_id()) {
    deadline_thread_.join();
  }
}

void StoreTable::check_key(const std::string& key) const {
  TESSEL_CHECK(key.size() <= limits_.max_key_bytes, InvalidArgument,
               "store key '{}' has {} bytes; the store's max_key_bytes limit is {}", shorten(key),
               key.size(), limits_.max_key_bytes);
}

void StoreTable::check_key_count(size_t n, const char* what) const {
  TESSEL_CHECK(n <= limits_.max_keys_per_call, InvalidArgument,
               "store {} names {} keys; the store's max_keys_per_call limit is {}", what, n,
               limits_.max_keys_per_call);
}

void StoreTable::check_value(const std::string& key, const std::string& value) const {
  TESSEL_CHECK(value.size() <= limits_.max_value_bytes, InvalidArgument,
               "store value for key '{}' has {} bytes; the store's max_value_bytes limit is {}",
               shorten(key), value.size(), limits_.max_value_bytes);
}

bool StoreTable::all_present_locked(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) TESSEL_REQUIRES(mutex_) {
    return data_.count(k) > 0;
  });
}

std::vector<std::string> StoreTable::values_locked(const std::vector<std::string>& keys) const {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(data_.at(k));
  return values;
}

void StoreTable::unpark_locked(StoreWaiter* waiter, const Parked& parked) {
  for (const auto& k : parked.keys) {
    auto it = waiting_on_.find(k);
    if (it == waiting_on_.end()) continue;
    it->second.erase(waiter);
    if (it->second.empty()) waiting_on_.erase(it);
  }
  deadlines_.erase(parked.deadline);
}

void StoreTable::put_locked(const std::string& key, const std::string& value, Finished& ready) {
  auto it = data_.find(key);
  if (it != data_.end()) {
    it->second = value;
    return;  // the key existed: nobody was waiting for it
  }
  TESSEL_CHECK(data_.size() < limits_.max_keys, CommError,
               "store is full: it holds {} keys, its max_keys limit; cannot add key '{}'",
               data_.size(), shorten(key));
  data_.emplace(key, value);
  auto waiting = waiting_on_.find(key);
  if (waiting == waiting_on_.end()) return;
  // A waiter is registered on every one of its keys; it is ready once all of them exist.
  const std::vector<StoreWaiter*> candidates(waiting->second.begin(), waiting->second.end());
  for (StoreWaiter* waiter : candidates) {
    auto parked = parked_.find(waiter);
    if (parked == parked_.end() || !all_present_locked(parked->second.keys)) continue;
    ready.emplace_back(waiter, parked->second.want_values ? values_locked(parked->second.keys)
                                                          : std::vector<std::string>());
    unpark_locked(waiter, parked->second);
    parked_.erase(parked);
  }
}

void StoreTable::finish_all(Finished& finished, WaitEnd end) {
  for (auto& [waiter, values] : finished) waiter->finish(end, std::move(values));
}

void StoreTable::set(const std::string& key, const std::string& value) {
  check_key(key);
  check_value(key, value);
  Finished ready;
  {
    MutexLock lock(mutex_);
    put_locked(key, value, ready);
  }
  finish_all(ready, WaitEnd::kReady);
}

int64_t StoreTable::add(const std::string& key, int64_t delta) {
  check_key(key);
  Finished ready;
  int64_t value = 0;
  {
    MutexLock lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) value = parse_store_counter(key, it->second);
    value = add_store_counter(key, value, delta);
    put_locked(key, std::to_string(value), ready);
  }
  finish_all(ready, WaitEnd::kReady);
  return value;
}

std::string StoreTable::compare_set(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  check_key(key);
  check_value(key, desired);
  Finished ready;
  {
    MutexLock lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end() ? !expected.empty() : it->second != expected) {
      return it == data_.end() ? std::string() : it->second;
    }
    put_locked(key, desired, ready);
  }
  finish_all(ready, WaitEnd::kReady);
  return desired;
}

bool StoreTable::check(const std::vector<std::string>& keys) {
  check_key_count(keys.size(), "check");
  MutexLock lock(mutex_);
  return all_present_locked(keys);
}

bool StoreTable::delete_key(const std::string& key) {
  MutexLock lock(mutex_);
  return data_.erase(key) > 0;
}

void StoreTable::multi_set(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  TESSEL_CHECK(keys.size() == values.size(), InvalidArgument, "multi_set: {} keys but {} values",
               keys.size(), values.size());
  check_key_count(keys.size(), "multi_set");
  for (size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    check_value(keys[i], values[i]);
  }
  Finished ready;
  {
    MutexLock lock(mutex_);
    size_t new_keys = 0;
    for (const auto& k : keys) new_keys += data_.count(k) == 0;
    TESSEL_CHECK(data_.size() + new_keys <= limits_.max_keys, CommError,
                 "store is full: it holds {} keys and multi_set adds {}; its max_keys limit is {}",
                 data_.size(), new_keys, limits_.max_keys);
    for (size_t i = 0; i < keys.size(); ++i) put_locked(keys[i], values[i], ready);
  }
  finish_all(ready, WaitEnd::kReady);
}

std::optional<std::vector<std::string>> StoreTable::get_or_park(
    const std::vector<std::string>& keys, bool want_values, Nanoseconds timeout,
    StoreWaiter* waiter) {
  check_key_count(keys.size(), want_values ? "get" : "wait");
  for (const auto& k : keys) check_key(k);
  std::vector<std::string> missing;
  {
    MutexLock lock(mutex_);
    if (all_present_locked(keys)) {
      return want_values ? values_locked(keys) : std::vector<std::string>();
    }
    TESSEL_CHECK(!stopped_, PeerLost, "the store server stopped; cannot wait for {}",
                 quote_store_keys(keys));
    if (timeout > Nanoseconds::zero()) {
      TESSEL_CHECK(parked_.size() < limits_.max_waiters, CommError,
                   "store has {} blocking calls waiting, its max_waiters limit; cannot wait "
                   "for {}",
                   parked_.size(), quote_store_keys(keys));
      const auto when = SteadyClock::now() + std::min(timeout, kLongestWait);
      const bool earliest = deadlines_.empty() || when < deadlines_.begin()->first;
      Parked parked{keys, want_values, deadlines_.emplace(when, waiter)};
      for (const auto& k : keys) waiting_on_[k].insert(waiter);
      parked_.emplace(waiter, std::move(parked));
      if (earliest) deadline_changed_.notify_one();
      return std::nullopt;
    }
    for (const auto& k : keys) {
      if (!data_.count(k)) missing.push_back(k);
    }
  }
  // A zero timeout: the answer is "not yet", now.
  waiter->finish(WaitEnd::kTimeout, std::move(missing));
  return std::nullopt;
}

bool StoreTable::cancel(StoreWaiter* waiter) {
  MutexLock lock(mutex_);
  auto it = parked_.find(waiter);
  if (it == parked_.end()) return false;
  unpark_locked(waiter, it->second);
  parked_.erase(it);
  return true;
}

StoreServerStats StoreTable::stats() const {
  MutexLock lock(mutex_);
  return StoreServerStats{data_.size(), parked_.size()};
}

void StoreTable::run_deadlines() {
  MutexLock lock(mutex_);
  while (!stopped_) {
    const auto now = SteadyClock::now();
    Finished expired;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      StoreWaiter* waiter = deadlines_.begin()->second;
      auto parked = parked_.find(waiter);
      std::vector<std::string> missing;
      for (const auto& k : parked->second.keys) {
        if (!data_.count(k)) missing.push_back(k);
      }
      unpark_locked(waiter, parked->second);
      parked_.erase(parked);
      expired.emplace_back(waiter, std::move(missing));
    }
    if (!expired.empty()) {
      lock.unlock();
      finish_all(expired, WaitEnd::kTimeout);
      lock.lock();
      continue;
    }
    auto wake = now + kIdleTick;
    if (!deadlines_.empty()) wake = std::min(wake, deadlines_.begin()->first);
    deadline_changed_.wait_until(lock, wake);
  }
}

}  // namespace tessel::internal
