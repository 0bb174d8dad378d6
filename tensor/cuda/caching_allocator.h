#pragma once
// The caching allocator behind CUDA device memory and pinned host memory: segments taken from
// a device are cut into blocks, freed blocks are kept per stream for reuse and merged with
// their free neighbours, and a block another stream used is held back until that stream has
// passed the free (events). It knows devices only through DeviceMemory, so its bookkeeping is
// tested on the CPU with a fake device (tests/tensor/caching_allocator_test.cc) and built in
// every build, with or without CUDA.
//
// Sizes (PyTorch's choices, which suit training's mix of many small and few large tensors):
// requests round up to 512 bytes; those up to 1 MiB come from 2 MiB segments (the small pool),
// up to 10 MiB from 20 MiB segments, larger ones from segments of their size rounded up to
// 2 MiB (the large pool). A cached block is split when the rest is worth keeping (512 bytes in
// the small pool, more than 1 MiB in the large one).
//
// The stream rule (storage.h): a block allocated for stream S goes back to S's pool when freed
// and only S's allocations take it. If record_stream() named other streams, the free records an
// event on each of them and the block joins its pool only once all have completed (checked at
// every allocation and at empty_cache, per stream in the order the frees were recorded, up to
// the first event not complete: a stream's events complete in order, so a check costs the
// frees it releases plus one). Blocks never move between streams except through the device:
// empty_cache and the retry after a failed allocation give whole free segments back.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tessel/tensor/storage.h"
#include "tessel/tensor/stream.h"

namespace tessel::cuda {

// One device's raw memory and stream-ordered events, as the caching allocator needs them.
// The allocator calls these with its lock held. Implementations: CUDA device memory and
// pinned host memory (cuda_allocator.cc), and fakes in tests.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` of fresh memory, or null when the device cannot provide them (not an exception:
  // the allocator frees its cache and retries). Throws for other failures.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr) noexcept = 0;
  // An event capturing the work issued so far to `stream` (an opaque handle); whether it has
  // completed; its release. record_event throws on failure.
  virtual void* record_event(const Stream& stream) = 0;
  virtual bool event_complete(void* event) = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  // The device's memory in a few words for error messages ("1.2 GiB free of 79.1 GiB").
  virtual std::string describe() = 0;
};

// The state of one device's cache, for tests and error messages.
struct CacheInfo {
  int64_t segments = 0;     // taken from the device
  int64_t free_blocks = 0;  // cached, ready for reuse by their stream
  int64_t free_bytes = 0;
  int64_t largest_free = 0;    // bytes of the largest free block
  int64_t pending_blocks = 0;  // freed, waiting for other streams' events
};

// Thread-safe: one mutex guards every device's state (allocations are short; contention
// between devices of one process is rare).
class CachingAllocator final : public Allocator {
 public:
  using MemoryFactory = std::function<std::unique_ptr<DeviceMemory>(int device_index)>;

  // Allocates for devices of `type`; `memory(i)` is called once, on device i's first use.
  // `name` starts error messages ("CUDA", "pinned host").
  CachingAllocator(DeviceType type, std::string name, MemoryFactory memory);
  ~CachingAllocator() override;

  DeviceType device_type() const override { return type_; }
  void* allocate(size_t bytes, const Stream& stream) override;
  void deallocate(void* ptr, size_t bytes) noexcept override;
  void record_stream(void* ptr, const Stream& stream) override;
  MemoryStats stats(int device_index) const override;
  void reset_peak_stats(int device_index) override;
  void empty_cache() override;

  CacheInfo cache_info(int device_index) const;

  // Rounding rules (see the file comment), exposed for tests.
  static size_t round_size(size_t bytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct DeviceCache;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::map<const Block*, Block*, BlockOrder>;

  DeviceCache& cache_of(int index);  // mu_ held
  Block* take_free_block(DeviceCache& d, const Stream& stream, size_t size);
  Block* new_segment(DeviceCache& d, const Stream& stream, size_t size, size_t requested);
  void split(DeviceCache& d, Block* block, size_t size);
  void free_block(DeviceCache& d, Block* block);
  void process_pending(DeviceCache& d);
  int64_t release_free_segments(DeviceCache& d);
  CacheInfo info(const DeviceCache& d) const;
  [[noreturn]] void throw_out_of_memory(DeviceCache& d, const Stream& stream, size_t requested,
                                        size_t rounded);

  const DeviceType type_;
  const std::string name_;
  const MemoryFactory memory_factory_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<DeviceCache>> devices_;  // guarded by mu_; index = device index
  std::unordered_map<void*, Block*> allocated_;        // guarded by mu_: live blocks by address
};

}  // namespace tessel::cuda
