#pragma once
// A map of at most `capacity` entries that forgets the least recently used one when full: the
// bound on caches that variable shapes would otherwise grow without end (the cuDNN SDPA graphs,
// the CUDA matmul's cuBLASLt setups). Header-only; counts its hits, misses and evictions.
//
// Not thread-safe: its user holds a lock around every call, or keeps one cache per thread.

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace tessel {

struct LruCacheCounts {
  int64_t hits = 0, misses = 0, evictions = 0;
};

// Keys are ordered by K's operator< (a std::map) unless `Hash` is given (a std::unordered_map
// with it and K's operator==). Values are stored in place: a pointer or reference to one stays
// valid until its entry is evicted or erased.
template <class K, class V, class Hash = void>
class LruCache {
 public:
  using Counts = LruCacheCounts;

  // A capacity below 1 is taken as 1.
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The value of `key` (now the most recently used; a hit), or nullptr (a miss).
  V* find(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++counts_.misses;
      return nullptr;
    }
    ++counts_.hits;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // Stores `value` under `key` unless the key is there already (then keeps the stored value);
  // returns the stored value, now the most recently used. Evicts the least recently used entry
  // when a new key finds the cache full. Counts neither a hit nor a miss.
  V& insert(K key, V value) {
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    if (index_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++counts_.evictions;
    }
    order_.emplace_front(std::move(key), std::move(value));
    index_.emplace(order_.front().first, order_.begin());
    return order_.front().second;
  }

  // Forgets `key`; false when it was not there.
  bool erase(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    order_.erase(it->second);
    index_.erase(it);
    return true;
  }

  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }
  const Counts& counts() const { return counts_; }

 private:
  using Entries = std::list<std::pair<K, V>>;  // most recently used first
  using Index = std::conditional_t<std::is_void_v<Hash>, std::map<K, typename Entries::iterator>,
                                   std::unordered_map<K, typename Entries::iterator, Hash>>;

  const size_t capacity_;
  Entries order_;
  Index index_;
  Counts counts_;
};

}  // namespace tessel
