#pragma once
// A map of at most `capacity` entries that forgets the least recently used one when full: the
// cuDNN SDPA graph cache, which variable shapes (a new sequence length per batch) would grow
// without bound. Not thread-safe: its user holds a lock around every call.

#include <cstddef>
#include <list>
#include <map>
#include <utility>

namespace tessel::kernels::attention {

template <class K, class V>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The value of `key` (now the most recently used), or nullptr.
  V* find(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // Inserts `value` under `key` unless the key is there already; returns the stored value (the
  // most recently used). Evicts the least recently used entry when the cache is full.
  V& insert(const K& key, V value) {
    if (V* found = find(key)) return *found;
    if (index_.size() == capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }

  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<std::pair<K, V>> order_;  // most recently used first
  std::map<K, typename std::list<std::pair<K, V>>::iterator> index_;
};

}  // namespace tessel::kernels::attention
