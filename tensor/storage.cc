#include "tessel/tensor/storage.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>

#include "tessel/base/error.h"

namespace tessel {
namespace {

constexpr size_t kCpuAlignment = 64;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment, and 0 gives no pointer.
    const size_t rounded = ((bytes + kCpuAlignment - 1) / kCpuAlignment) * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    TESSEL_CHECK(ptr != nullptr, Unavailable, "out of host memory allocating {} bytes", bytes);
    return ptr;
  }
  void deallocate(void* ptr, size_t) noexcept override { std::free(ptr); }
  Device device() const override { return Device::cpu(); }
};

std::array<std::atomic<Allocator*>, 2> g_allocators = {&cpu_allocator(), nullptr};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

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
