#pragma once
// Private: a pool of native device events, one free list per (device, timing), so an operation
// that needs an event (a free recorded for the stream rule, an NCCL call's start and end, an
// Event) takes a used one instead of creating and destroying one each time. Plain C++ over
// create/destroy hooks, so the pooling is tested on the CPU (tests/tensor/event_pool_test.cc);
// the CUDA runtime's pool wraps cudaEventCreateWithFlags / cudaEventDestroy.
//
// Reuse is safe whatever the event last captured: recording an event replaces what it held,
// and a stream that waits on an event waits for what it held when the wait was issued.
//
// Thread-safe (one mutex). Owns the events it made: free ones are destroyed with the pool, and
// an event released into a full free list is destroyed at once.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tessel::cuda {

class EventPool {
 public:
  struct Hooks {
    std::function<void*(int device, bool timing)> create;  // throws on failure
    std::function<void(void*)> destroy;                    // must not throw
  };
  // What the pool did so far, for tests and statistics.
  struct Counts {
    int64_t created = 0;    // events made by the hook
    int64_t reused = 0;     // acquisitions served from a free list
    int64_t destroyed = 0;  // events given back to the hook
    int64_t free = 0;       // events in the free lists now
  };

  explicit EventPool(Hooks hooks, size_t max_free_per_key = 1024);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event of `device`, timed or not: a free one, else a new one (the create hook's errors
  // propagate).
  void* acquire(int device, bool timing);
  // Gives an event from acquire() back. An event the pool did not make is ignored (logged).
  void release(void* event) noexcept;
  Counts counts() const;

 private:
  using Key = std::pair<int, bool>;
  const Hooks hooks_;
  const size_t max_free_per_key_;
  mutable std::mutex mutex_;
  std::map<Key, std::vector<void*>> free_;  // guarded by mutex_
  std::unordered_map<void*, Key> made_;     // every live event the pool made; guarded
  Counts counts_;                           // guarded by mutex_ (free computed on demand)
};

}  // namespace tessel::cuda
