#pragma once
// Private: a registry slot (backend, runtime, allocator of one device type) that takes a built-in
// object on first use when nothing was registered: how the CUDA backend's objects reach the
// registries without depending on static initialisation order.

#include <atomic>

namespace tessel::internal {

// slot's object, or builtin()'s (which may be null) stored there first. Thread-safe; a
// registration made meanwhile wins.
template <typename T>
T* slot_or_builtin(std::atomic<T*>& slot, T* (*builtin)()) {
  T* value = slot.load(std::memory_order_acquire);
  if (value != nullptr) return value;
  T* expected = nullptr;
  slot.compare_exchange_strong(expected, builtin(), std::memory_order_acq_rel);
  return slot.load(std::memory_order_acquire);
}

}  // namespace tessel::internal
