#include "tessel/store/memory_store.h"

#include <charconv>

#include "tessel/base/error.h"

namespace tessel {

int64_t parse_store_counter(const std::string& key, const std::string& value) {
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  TESSEL_CHECK(ec == std::errc() && end == value.data() + value.size(), InvalidArgument,
               "store key '{}' holds '{}', which is not a counter", key,
               value.size() > 64 ? value.substr(0, 64) + "..." : value);
  return n;
}

int64_t add_store_counter(const std::string& key, int64_t value, int64_t delta) {
  int64_t sum = 0;
  TESSEL_CHECK(!__builtin_add_overflow(value, delta, &sum), InvalidArgument,
               "store add of {} to key '{}' (holding {}) overflows a 64-bit counter", delta,
               key.size() > 64 ? key.substr(0, 64) + "..." : key, value);
  return sum;
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    MutexLock lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

void MemoryStore::wait_locked(MutexLock& lock, const std::vector<std::string>& keys,
                              Nanoseconds timeout) {
  auto all_present = [&]() TESSEL_REQUIRES(mutex_) {
    for (const auto& k : keys) {
      if (!data_.count(k)) return false;
    }
    return true;
  };
  const Deadline deadline = Deadline::after(timeout);
  while (!all_present()) {
    if (deadline.expired() ||
        changed_.wait_until(lock, deadline.when()) == std::cv_status::timeout) {
      if (all_present()) return;
      std::string missing;
      for (const auto& k : keys) {
        if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
      }
      throw Timeout(
          fmt::format("store: key(s) {} not set within {}", missing, format_duration(timeout)));
    }
  }
}

std::string MemoryStore::get(const std::string& key, Nanoseconds timeout) {
  MutexLock lock(mutex_);
  wait_locked(lock, {key}, timeout);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    MutexLock lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) value = parse_store_counter(key, it->second);
    value = add_store_counter(key, value, delta);
    data_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string result;
  {
    MutexLock lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return std::string();
      data_[key] = desired;
      result = desired;
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
    } else {
      return it->second;
    }
  }
  changed_.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Nanoseconds timeout) {
  MutexLock lock(mutex_);
  wait_locked(lock, keys, timeout);
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  MutexLock lock(mutex_);
  for (const auto& k : keys) {
    if (!data_.count(k)) return false;
  }
  return true;
}

bool MemoryStore::delete_key(const std::string& key) {
  MutexLock lock(mutex_);
  return data_.erase(key) > 0;
}

std::vector<std::string> MemoryStore::multi_get(const std::vector<std::string>& keys,
                                                Nanoseconds timeout) {
  MutexLock lock(mutex_);
  wait_locked(lock, keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(data_.at(k));
  return values;
}

void MemoryStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  TESSEL_CHECK(keys.size() == values.size(), InvalidArgument, "multi_set: {} keys but {} values",
               keys.size(), values.size());
  {
    MutexLock lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

size_t MemoryStore::size() const {
  MutexLock lock(mutex_);
  return data_.size();
}

}  // namespace tessel
