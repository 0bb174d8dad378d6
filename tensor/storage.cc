#include "tessel/tensor/storage.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "tessel/base/error.h"

namespace tessel {
namespace {

constexpr size_t kCpuAlignment = 64;
// Blocks of at least kCacheMinBytes are kept for reuse (exact size), up to kCacheLimitBytes in
// all: fresh pages cost a page fault and a zeroing per 4 KiB in the kernel, which doubled the
// time of elementwise ops on large tensors; training steps reallocate the same sizes each step.
constexpr size_t kCacheMinBytes = size_t{1} << 20;
constexpr size_t kCacheLimitBytes = size_t{1} << 30;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment, and 0 gives no pointer.
    const size_t rounded = round_up(bytes);
    if (rounded >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(rounded);
      if (it != cache_.end()) {
        void* ptr = it->second;
        cache_.erase(it);
        cached_bytes_ -= rounded;
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (ptr == nullptr && rounded >= kCacheMinBytes) {
      release_cache();  // memory may be held by the cache: give it back and retry once
      ptr = std::aligned_alloc(kCpuAlignment, rounded);
    }
    TESSEL_CHECK(ptr != nullptr, Unavailable, "out of host memory allocating {} bytes", bytes);
    return ptr;
  }

  void deallocate(void* ptr, size_t bytes) noexcept override {
    const size_t rounded = round_up(bytes);
    if (rounded >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_bytes_ + rounded <= kCacheLimitBytes) {
        cache_.emplace(rounded, ptr);
        cached_bytes_ += rounded;
        return;
      }
    }
    std::free(ptr);
  }

  Device device() const override { return Device::cpu(); }

  void release_cache() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, ptr] : cache_) std::free(ptr);
    cache_.clear();
    cached_bytes_ = 0;
  }

 private:
  static size_t round_up(size_t bytes) {
    const size_t rounded = ((bytes + kCpuAlignment - 1) / kCpuAlignment) * kCpuAlignment;
    return rounded == 0 ? kCpuAlignment : rounded;
  }

  std::mutex mu_;
  std::multimap<size_t, void*> cache_;  // guarded by mu_
  size_t cached_bytes_ = 0;             // guarded by mu_
};

// Never destroyed: tensors in other static objects may free memory during exit.
CpuAllocator& cpu_allocator_impl() {
  static CpuAllocator* allocator = new CpuAllocator;
  return *allocator;
}

std::array<std::atomic<Allocator*>, 2> g_allocators = {&cpu_allocator(), nullptr};

}  // namespace

Allocator& cpu_allocator() { return cpu_allocator_impl(); }

void release_cpu_allocator_cache() { cpu_allocator_impl().release_cache(); }

Allocator& allocator_for(Device device) {
  Allocator* a = g_allocators[static_cast<size_t>(device.type)].load(std::memory_order_acquire);
  TESSEL_CHECK(a != nullptr, Unavailable,
               "no allocator for device {}: this build of tessel has no backend for it",
               device.str());
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  g_allocators[static_cast<size_t>(type)].store(allocator, std::memory_order_release);
}

struct Storage::Impl {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  std::function<void(void*)> deleter;
  ~Impl() {
    if (deleter) deleter(data);
  }
};

Storage Storage::allocate(size_t bytes, Device device) {
  Allocator& allocator = allocator_for(device);
  void* data = allocator.allocate(bytes);
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = data;
  s.impl_->bytes = bytes;
  s.impl_->device = device;
  s.impl_->deleter = [&allocator, bytes](void* p) { allocator.deallocate(p, bytes); };
  return s;
}

Storage Storage::wrap(void* data, size_t bytes, Device device,
                      std::function<void(void*)> deleter) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = data;
  s.impl_->bytes = bytes;
  s.impl_->device = device;
  s.impl_->deleter = std::move(deleter);
  return s;
}

void* Storage::data() const { return impl_ ? impl_->data : nullptr; }
size_t Storage::bytes() const { return impl_ ? impl_->bytes : 0; }
Device Storage::device() const { return impl_ ? impl_->device : Device::cpu(); }

}  // namespace tessel
