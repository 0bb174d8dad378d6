#pragma once
// Memory behind tensors: allocators per device type and Storage, a shared, sized allocation.

#include <cstddef>
#include <functional>
#include <memory>

#include "tessel/tensor/device.h"

namespace tessel {

// Hands out raw device memory. Implementations are thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `bytes` bytes (a unique non-null pointer even for 0); throws on failure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
  virtual Device device() const = 0;
};

// 64-byte aligned host memory. Process-wide singleton. Blocks of 1 MiB or more are cached for
// reuse by exact size (up to 1 GiB in all), because training steps allocate the same sizes
// every step and fresh pages are expensive; release_cpu_allocator_cache() frees that memory.
Allocator& cpu_allocator();
void release_cpu_allocator_cache();

// The allocator for `device`'s type. Throws Unavailable when none is registered (e.g. CUDA in a
// build without CUDA).
Allocator& allocator_for(Device device);
// Registers the allocator used for every device of `type` (not owned; must outlive its use).
// Device backends call this once at start-up.
void register_allocator(DeviceType type, Allocator* allocator);

// A shared allocation: copies share the memory, the last one frees it. Copying is thread-safe;
// the bytes themselves are not synchronised.
class Storage {
 public:
  Storage() = default;
  // Fresh memory from allocator_for(device).
  static Storage allocate(size_t bytes, Device device);
  // Memory owned elsewhere; `deleter` (may be empty) runs when the last copy goes away.
  static Storage wrap(void* data, size_t bytes, Device device,
                      std::function<void(void*)> deleter);

  bool defined() const { return impl_ != nullptr; }
  void* data() const;
  size_t bytes() const;
  Device device() const;
  long use_count() const { return impl_.use_count(); }
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessel
