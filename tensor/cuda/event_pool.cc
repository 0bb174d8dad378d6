#include "tessel/tensor/cuda/event_pool.h"

#include "tessel/base/logging.h"

namespace tessel::cuda {

EventPool::EventPool(Hooks hooks, size_t max_free_per_key)
    : hooks_(std::move(hooks)), max_free_per_key_(max_free_per_key) {}

EventPool::~EventPool() {
  for (auto& [key, events] : free_) {
    for (void* e : events) hooks_.destroy(e);
  }
}

void* EventPool::acquire(int device, bool timing) {
  {
    std::lock_guard lock(mutex_);
    auto it = free_.find(Key{device, timing});
    if (it != free_.end() && !it->second.empty()) {
      void* e = it->second.back();
      it->second.pop_back();
      ++counts_.reused;
      return e;
    }
  }
  // Created outside the lock: the hook may take the device's time.
  void* e = hooks_.create(device, timing);
  std::lock_guard lock(mutex_);
  made_.emplace(e, Key{device, timing});
  ++counts_.created;
  return e;
}

void EventPool::release(void* event) noexcept {
  if (event == nullptr) return;
  bool destroy = false;
  {
    std::lock_guard lock(mutex_);
    auto it = made_.find(event);
    if (it == made_.end()) {
      log_error(LogComponent::kTensor, "event pool: release of {} which it did not make; ignored",
                event);
      return;
    }
    std::vector<void*>& list = free_[it->second];
    if (list.size() < max_free_per_key_) {
      list.push_back(event);
    } else {
      made_.erase(it);
      ++counts_.destroyed;
      destroy = true;
    }
  }
  if (destroy) hooks_.destroy(event);
}

EventPool::Counts EventPool::counts() const {
  std::lock_guard lock(mutex_);
  Counts c = counts_;
  for (const auto& [key, events] : free_) c.free += static_cast<int64_t>(events.size());
  return c;
}

}  // namespace tessel::cuda
