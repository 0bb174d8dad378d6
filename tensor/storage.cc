#include "tessel/tensor/storage.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda_builtin.h"
#include "tessel/tensor/internal/builtin_slot.h"

namespace tessel {
namespace {

constexpr size_t kCpuAlignment = 64;
// Blocks of at least kCacheMinBytes are kept for reuse (exact size), up to kCacheLimitBytes in
// all: fresh pages cost a page fault and a zeroing per 4 KiB in the kernel, which doubled the
// time of elementwise ops on large tensors; training steps reallocate the same sizes each step.
constexpr size_t kCacheMinBytes = size_t{1} << 20;
constexpr size_t kCacheLimitBytes = size_t{1} << 30;
// Blocks of kRecentMinBytes up to kCacheMinBytes: the most recently freed are kept, up to
// kRecentLimitBytes, the oldest given back first. A per-call buffer (a collective's 512 KiB
// result) is then the same block each call: glibc gives such blocks back to the kernel when they
// end its heap and faults their pages in again, which cost a 1 MiB all_to_all 5-15% of its time.
// Not all of them, by exact size like the large ones: that held a GPT step's activations apart
// from the memory its other sizes then used, and its compute took 40% longer.
constexpr size_t kRecentMinBytes = size_t{1} << 16;
constexpr size_t kRecentLimitBytes = size_t{4} << 20;

void atomic_max(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (seen < value && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Lock-free counters behind MemoryStats for allocators that keep one set per device.
class StatCounters {
 public:
  void on_allocate(int64_t bytes, bool from_cache) {
    allocations_.fetch_add(1, std::memory_order_relaxed);
    atomic_max(peak_allocated_, allocated_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    if (!from_cache) {
      atomic_max(peak_reserved_, reserved_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    }
  }
  void on_free(int64_t bytes, bool to_cache) {
    frees_.fetch_add(1, std::memory_order_relaxed);
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
    if (!to_cache) reserved_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  void on_release_cached(int64_t bytes) { reserved_.fetch_sub(bytes, std::memory_order_relaxed); }
  void on_flush() { cache_flushes_.fetch_add(1, std::memory_order_relaxed); }
  void on_failure() { failures_.fetch_add(1, std::memory_order_relaxed); }

  MemoryStats snapshot() const {
    MemoryStats s;
    s.allocated_bytes = allocated_.load(std::memory_order_relaxed);
    s.reserved_bytes = reserved_.load(std::memory_order_relaxed);
    s.peak_allocated_bytes = peak_allocated_.load(std::memory_order_relaxed);
    s.peak_reserved_bytes = peak_reserved_.load(std::memory_order_relaxed);
    s.allocations = allocations_.load(std::memory_order_relaxed);
    s.frees = frees_.load(std::memory_order_relaxed);
    s.cache_flushes = cache_flushes_.load(std::memory_order_relaxed);
    s.failures = failures_.load(std::memory_order_relaxed);
    return s;
  }
  void reset_peaks() {
    peak_allocated_.store(allocated_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    peak_reserved_.store(reserved_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> allocated_{0}, reserved_{0}, peak_allocated_{0}, peak_reserved_{0};
  std::atomic<int64_t> allocations_{0}, frees_{0}, cache_flushes_{0}, failures_{0};
};

// Host memory. Streams play no part: CPU work is complete when issued.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() { recent_.reserve(kRecentLimitBytes / kRecentMinBytes + 1); }

  DeviceType device_type() const override { return DeviceType::kCPU; }

  void* allocate(size_t bytes, const Stream&) override {
    // aligned_alloc needs a size that is a multiple of the alignment, and 0 gives no pointer.
    const size_t rounded = round_up(bytes);
    if (rounded >= kRecentMinBytes && rounded < kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = recent_.rbegin(); it != recent_.rend(); ++it) {  // the latest freed first
        if (it->first != rounded) continue;
        void* ptr = it->second;
        recent_.erase(std::next(it).base());
        recent_bytes_ -= rounded;
        stats_.on_allocate(static_cast<int64_t>(rounded), true);
        return ptr;
      }
    } else if (rounded >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(rounded);
      if (it != cache_.end()) {
        void* ptr = it->second;
        cache_.erase(it);
        cached_bytes_ -= rounded;
        stats_.on_allocate(static_cast<int64_t>(rounded), true);
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (ptr == nullptr && rounded >= kRecentMinBytes) {
      stats_.on_flush();
      empty_cache();  // memory may be held by the cache: give it back and retry once
      ptr = std::aligned_alloc(kCpuAlignment, rounded);
    }
    if (ptr == nullptr) {
      stats_.on_failure();
      throw OutOfMemory(
          fmt::format("out of host memory allocating {} ({} bytes); cpu allocator: {}",
                      bytes_str(static_cast<int64_t>(bytes)), bytes, stats_.snapshot().str()));
    }
    stats_.on_allocate(static_cast<int64_t>(rounded), false);
    return ptr;
  }

  void deallocate(void* ptr, size_t bytes) noexcept override {
    const size_t rounded = round_up(bytes);
    if (rounded >= kRecentMinBytes && rounded < kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      recent_.emplace_back(rounded, ptr);  // within the capacity reserved: never throws
      recent_bytes_ += rounded;
      stats_.on_free(static_cast<int64_t>(rounded), true);
      size_t drop = 0;
      for (; recent_bytes_ > kRecentLimitBytes; ++drop) recent_bytes_ -= recent_[drop].first;
      release(std::span(recent_).first(drop));
      recent_.erase(recent_.begin(), recent_.begin() + static_cast<ptrdiff_t>(drop));
      return;
    }
    if (rounded >= kCacheMinBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_bytes_ + rounded <= kCacheLimitBytes) {
        cache_.emplace(rounded, ptr);
        cached_bytes_ += rounded;
        stats_.on_free(static_cast<int64_t>(rounded), true);
        return;
      }
    }
    stats_.on_free(static_cast<int64_t>(rounded), false);
    std::free(ptr);
  }

  MemoryStats stats(int) const override { return stats_.snapshot(); }
  void reset_peak_stats(int) override { stats_.reset_peaks(); }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, ptr] : cache_) {
      std::free(ptr);
      stats_.on_release_cached(static_cast<int64_t>(size));
    }
    cache_.clear();
    cached_bytes_ = 0;
    release(recent_);
    recent_.clear();
    recent_bytes_ = 0;
  }

 private:
  static size_t round_up(size_t bytes) {
    const size_t rounded = ((bytes + kCpuAlignment - 1) / kCpuAlignment) * kCpuAlignment;
    return rounded == 0 ? kCpuAlignment : rounded;
  }

  void release(std::span<const std::pair<size_t, void*>> blocks) {  // mu_ held
    for (const auto& [size, ptr] : blocks) {
      std::free(ptr);
      stats_.on_release_cached(static_cast<int64_t>(size));
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void*> cache_;            // guarded by mu_
  size_t cached_bytes_ = 0;                       // guarded by mu_
  std::vector<std::pair<size_t, void*>> recent_;  // in the order freed; guarded by mu_
  size_t recent_bytes_ = 0;                       // guarded by mu_
  StatCounters stats_;
};

// Never destroyed: tensors in other static objects may free memory during exit.
CpuAllocator& cpu_allocator_impl() {
  static CpuAllocator* allocator = new CpuAllocator;
  return *allocator;
}

std::array<std::atomic<Allocator*>, kDeviceTypeCount> g_allocators = {&cpu_allocator_impl(),
                                                                      nullptr, nullptr};
std::atomic<Allocator*> g_pinned{nullptr};

// A registered allocator, or the CUDA backend's (taken on first use; null without CUDA).
Allocator* allocator_slot(DeviceType type) {
  std::atomic<Allocator*>& slot = g_allocators[static_cast<size_t>(type)];
  if (type != DeviceType::kCUDA) return slot.load(std::memory_order_acquire);
  return internal::slot_or_builtin(slot, &cuda::builtin_allocator);
}
Allocator* pinned_slot() {
  return internal::slot_or_builtin(g_pinned, &cuda::builtin_pinned_allocator);
}

}  // namespace

std::string bytes_str(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

std::string MemoryStats::str() const {
  return fmt::format("allocated {} (peak {}), reserved {} (peak {})", bytes_str(allocated_bytes),
                     bytes_str(peak_allocated_bytes), bytes_str(reserved_bytes),
                     bytes_str(peak_reserved_bytes));
}

void Allocator::record_stream(void*, const Stream&) {}

Allocator& cpu_allocator() { return cpu_allocator_impl(); }

Allocator& allocator_for(Device device) {
  Allocator* a = allocator_slot(device.type);
  TESSEL_CHECK(!device.is_meta(), InvalidArgument, "the meta device allocates no memory");
  TESSEL_CHECK(a != nullptr, Unavailable,
               "no allocator for device {}: this build of tessel has no backend for it",
               device.str());
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  g_allocators[static_cast<size_t>(type)].store(allocator, std::memory_order_release);
}

Allocator& pinned_allocator() {
  Allocator* a = pinned_slot();
  TESSEL_CHECK(a != nullptr, Unavailable,
               "pinned host memory needs a device backend that provides it (CUDA); this build "
               "of tessel has none");
  return *a;
}
void register_pinned_allocator(Allocator* allocator) {
  g_pinned.store(allocator, std::memory_order_release);
}
bool has_pinned_allocator() { return pinned_slot() != nullptr; }

MemoryStats memory_stats(Device device) {
  if (device.is_meta()) return {};
  check_device_available(device);
  return allocator_for(device).stats(device.index);
}
void reset_peak_memory_stats(Device device) {
  if (device.is_meta()) return;
  check_device_available(device);
  allocator_for(device).reset_peak_stats(device.index);
}
void empty_cache(Device device) {
  if (device.is_meta()) return;
  check_device_available(device);
  allocator_for(device).empty_cache();
}
MemoryStats pinned_memory_stats() {
  return has_pinned_allocator() ? pinned_allocator().stats(0) : MemoryStats{};
}

// ---- Storage --------------------------------------------------------------------------------

struct Storage::Impl {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  bool pinned = false;
  bool released = false;
  Allocator* allocator = nullptr;      // memory from an allocator (null: wrapped or meta)
  std::function<void(void*)> deleter;  // wrapped memory

  void free_memory() noexcept {
    if (data == nullptr) return;
    if (allocator != nullptr) {
      allocator->deallocate(data, bytes);
    } else if (deleter) {
      deleter(data);
    }
    data = nullptr;
  }
  ~Impl() { free_memory(); }
};

Storage Storage::allocate(size_t bytes, Device device) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->bytes = bytes;
  s.impl_->device = device;
  if (!device.is_meta()) {
    check_device_available(device);
    s.impl_->allocator = &allocator_for(device);
    s.impl_->data = s.impl_->allocator->allocate(bytes, current_stream(device));
  }
  return s;
}

Storage Storage::allocate_pinned(size_t bytes) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->bytes = bytes;
  s.impl_->device = Device::cpu();
  s.impl_->pinned = true;
  s.impl_->allocator = &pinned_allocator();
  s.impl_->data = s.impl_->allocator->allocate(bytes, current_stream(Device::cpu()));
  return s;
}

Storage Storage::wrap(void* data, size_t bytes, Device device, std::function<void(void*)> deleter) {
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
bool Storage::is_pinned() const { return impl_ && impl_->pinned; }
bool Storage::is_released() const { return impl_ && impl_->released; }

void Storage::release() const {
  TESSEL_CHECK(impl_ != nullptr, InvalidArgument, "release() of an undefined storage");
  if (impl_->released || impl_->device.is_meta()) return;
  TESSEL_CHECK(impl_->allocator != nullptr, InvalidArgument,
               "release(): a storage wrapping memory owned elsewhere cannot be released");
  impl_->free_memory();
  impl_->released = true;
}

void Storage::refill() const {
  TESSEL_CHECK(impl_ != nullptr, InvalidArgument, "refill() of an undefined storage");
  if (!impl_->released) return;
  impl_->data = impl_->allocator->allocate(impl_->bytes, current_stream(impl_->device));
  impl_->released = false;
}

void Storage::record_stream(const Stream& stream) const {
  if (impl_ == nullptr || impl_->data == nullptr || impl_->allocator == nullptr) return;
  TESSEL_CHECK(impl_->pinned || stream.device() == impl_->device, InvalidArgument,
               "record_stream: a storage on {} cannot be used by {}", impl_->device.str(),
               stream.str());
  impl_->allocator->record_stream(impl_->data, stream);
}

}  // namespace tessel
