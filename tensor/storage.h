#pragma once
// Memory behind tensors: allocators per device type (with memory statistics and stream-aware
// reuse), pinned host memory, and Storage, a shared allocation that can be released and
// refilled in place.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "tessel/tensor/device.h"
#include "tessel/tensor/stream.h"

namespace tessel {

// Counters of one device's allocator. Bytes are the allocator's block sizes (requests rounded
// up), as PyTorch's memory_stats report them.
struct MemoryStats {
  int64_t allocated_bytes = 0;       // held by live storages
  int64_t reserved_bytes = 0;        // held from the system: allocated plus cached for reuse
  int64_t peak_allocated_bytes = 0;  // highest allocated_bytes since the last reset
  int64_t peak_reserved_bytes = 0;   // highest reserved_bytes since the last reset
  int64_t allocations = 0;           // allocate() calls since the process started
  int64_t frees = 0;                 // deallocate() calls
  int64_t cache_flushes = 0;         // allocations that emptied the cache to retry
  int64_t failures = 0;              // allocations that threw OutOfMemory

  // "allocated 1.0 MiB (peak 3.0 MiB), reserved 4.0 MiB (peak 4.0 MiB)".
  std::string str() const;
};

// "512 B", "1.5 KiB", "3.0 MiB", "1.25 GiB": byte counts as memory statistics print them.
std::string bytes_str(int64_t bytes);

// Hands out raw device memory and caches it for reuse. Implementations are thread-safe.
//
// Stream rule: memory allocated for use on stream S is, once deallocated, reused at once by
// later allocations on S (their work is ordered after the last use) and by other streams only
// after every stream given to record_stream() has passed the point of the deallocation.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DeviceType device_type() const = 0;
  // Memory for `bytes` bytes on `stream`'s device, for use on `stream`: a unique non-null
  // pointer, also for 0 bytes. Throws OutOfMemory naming the request and the allocator's state
  // when the device cannot satisfy it even after emptying the cache.
  virtual void* allocate(size_t bytes, const Stream& stream) = 0;
  // Returns memory from allocate(ptr was allocated with `bytes`).
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
  // Marks `ptr` as also used by `stream` (see the stream rule). Default: nothing to do, for
  // devices whose streams are always complete.
  virtual void record_stream(void* ptr, const Stream& stream);
  virtual MemoryStats stats(int device_index) const = 0;
  virtual void reset_peak_stats(int device_index) = 0;
  // Frees cached blocks that no storage uses (and whose streams are done) back to the system.
  virtual void empty_cache() = 0;
};

// 64-byte aligned host memory. Process-wide singleton. Blocks of 1 MiB or more are cached for
// reuse by exact size (up to 1 GiB in all), because training steps allocate the same sizes
// every step and fresh pages are expensive.
Allocator& cpu_allocator();

// The allocator for `device`'s type. Throws Unavailable when none is registered (e.g. CUDA in a
// build without CUDA). The meta device has none: its storages hold no memory.
Allocator& allocator_for(Device device);
// Replaces the allocator used for every device of `type` (not owned; must outlive its use): a
// custom allocator, installed before the first allocation. The built-in allocators (CPU, and
// CUDA where the build has it) need no registration; they are found on first use.
void register_allocator(DeviceType type, Allocator* allocator);
// Page-locked host memory for fast, asynchronous copies to and from devices. Registered by a
// device backend that has it (CUDA); throws Unavailable naming the reason otherwise.
Allocator& pinned_allocator();
// Replaces the pinned-host allocator, as register_allocator does for devices.
void register_pinned_allocator(Allocator* allocator);
bool has_pinned_allocator();

// Statistics, peak reset and cache release of `device`'s allocator (the meta device: zeros).
MemoryStats memory_stats(Device device);
void reset_peak_memory_stats(Device device);
void empty_cache(Device device);
// Statistics of pinned host memory (zeros when there is no pinned allocator).
MemoryStats pinned_memory_stats();

// A shared allocation: copies share the memory and the last one frees it. The memory may be
// released and refilled in place (FSDP frees unsharded parameters between uses): every tensor
// viewing the storage — also the detached copies autograd saves for backward — sees the
// refilled memory. Reading a released storage throws. Copying a Storage handle is
// thread-safe; releasing, refilling and the bytes themselves are not synchronised.
class Storage {
 public:
  Storage() = default;
  // Fresh memory from allocator_for(device), for use on the device's current stream. The meta
  // device gets a storage of the given size that holds no memory.
  static Storage allocate(size_t bytes, Device device);
  // Page-locked host memory (see pinned_allocator()).
  static Storage allocate_pinned(size_t bytes);
  // Memory owned elsewhere; `deleter` (may be empty) runs when the last copy goes away.
  static Storage wrap(void* data, size_t bytes, Device device, std::function<void(void*)> deleter);

  bool defined() const { return impl_ != nullptr; }
  // Null for the meta device and while released.
  void* data() const;
  // The size the storage was made with (unchanged while released).
  size_t bytes() const;
  Device device() const;
  bool is_pinned() const;
  long use_count() const { return impl_.use_count(); }
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }

  // Gives the memory back to the allocator now; views keep their shapes and reading them
  // throws until refill(). Idempotent. Throws InvalidArgument for wrapped memory.
  void release() const;
  // Allocates fresh memory of bytes() for a released storage (contents undefined), on the
  // device's current stream. A no-op when not released.
  void refill() const;
  bool is_released() const;
  // Marks the memory as used by `stream` too, so the allocator does not hand it to another
  // stream before that stream's work on it is done (see Allocator).
  void record_stream(const Stream& stream) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessel
