#include "tessel/tensor/cuda/caching_allocator.h"

#include <algorithm>
#include <deque>
#include <set>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"

namespace tessel::cuda {
namespace {

constexpr size_t kMinBlock = 512;                    // every size is a multiple of this
constexpr size_t kSmallSize = size_t{1} << 20;       // requests up to this use the small pool
constexpr size_t kSmallSegment = size_t{2} << 20;    // segments of the small pool
constexpr size_t kLargeSegment = size_t{20} << 20;   // segments for requests under kMinLarge
constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // from here segments fit the request
constexpr size_t kLargeRounding = size_t{2} << 20;

size_t round_up(size_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

}  // namespace

enum class BlockState : uint8_t { kLive, kPending, kFree };

// A range of one segment. Blocks of a segment are linked in address order; free neighbours
// are always merged, so a free block's neighbours are live or pending.
struct CachingAllocator::Block {
  int device = 0;
  Stream stream;  // the stream it was allocated for (its pool)
  char* ptr = nullptr;
  size_t size = 0;
  bool small = false;  // which pool its segment belongs to
  BlockState state = BlockState::kFree;
  Block* prev = nullptr;
  Block* next = nullptr;
  std::vector<Stream> uses;  // other streams named by record_stream
  int pending_uses = 0;      // while pending: the uses whose free event has not completed
};

bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  if (a->stream.id() != b->stream.id()) return a->stream.id() < b->stream.id();
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

struct CachingAllocator::DeviceCache {
  // A free recorded on a stream that used the block: the block's reuse waits for the event.
  struct PendingFree {
    void* event = nullptr;
    Block* block = nullptr;
  };
  std::unique_ptr<DeviceMemory> memory;
  std::set<Block*, BlockOrder> small_free, large_free;
  // Per stream (by id), its pending frees in the order they were recorded: a stream's events
  // complete in that order, so a check stops at the first incomplete one.
  std::map<int64_t, std::deque<PendingFree>> pending;
  int64_t pending_blocks = 0;
  int64_t segments = 0;
  MemoryStats stats;

  std::set<Block*, BlockOrder>& pool(const Block* b) { return b->small ? small_free : large_free; }
};

CachingAllocator::CachingAllocator(DeviceType type, std::string name, MemoryFactory memory)
    : type_(type), name_(std::move(name)), memory_factory_(std::move(memory)) {}

CachingAllocator::~CachingAllocator() {
  // Gives every segment back (live blocks included: their storages must be gone by now).
  std::set<Block*> heads;
  auto note = [&](Block* b) {
    while (b->prev != nullptr) b = b->prev;
    heads.insert(b);
  };
  for (auto& [ptr, b] : allocated_) note(b);
  for (auto& d : devices_) {
    if (!d) continue;
    for (Block* b : d->small_free) note(b);
    for (Block* b : d->large_free) note(b);
    for (auto& [stream, queue] : d->pending) {
      for (const DeviceCache::PendingFree& p : queue) {
        note(p.block);
        d->memory->destroy_event(p.event);
      }
    }
  }
  for (Block* head : heads) {
    DeviceCache& d = *devices_[head->device];
    d.memory->free(head->ptr);
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

size_t CachingAllocator::round_size(size_t bytes) {
  return std::max(kMinBlock, round_up(bytes, kMinBlock));
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return round_up(rounded, kLargeRounding);
}

CachingAllocator::DeviceCache& CachingAllocator::cache_of(int index) {
  TESSEL_CHECK(index >= 0, InvalidArgument, "{} allocator: device index {} is negative", name_,
               index);
  if (static_cast<size_t>(index) >= devices_.size()) devices_.resize(index + 1);
  if (!devices_[index]) {
    auto d = std::make_unique<DeviceCache>();
    d->memory = memory_factory_(index);
    devices_[index] = std::move(d);
  }
  return *devices_[index];
}

CachingAllocator::Block* CachingAllocator::take_free_block(DeviceCache& d, const Stream& stream,
                                                           size_t size) {
  auto& pool = size <= kSmallSize ? d.small_free : d.large_free;
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || !((*it)->stream == stream)) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(DeviceCache& d, const Stream& stream,
                                                       size_t size, size_t requested) {
  const size_t bytes = segment_size(size);
  void* ptr = d.memory->allocate(bytes);
  if (ptr == nullptr) {
    // The cache may hold what the device lacks: give whole free segments back and retry once.
    ++d.stats.cache_flushes;
    process_pending(d);
    release_free_segments(d);
    ptr = d.memory->allocate(bytes);
  }
  if (ptr == nullptr) throw_out_of_memory(d, stream, requested, bytes);
  auto* b = new Block;
  b->device = stream.device().index;
  b->stream = stream;
  b->ptr = static_cast<char*>(ptr);
  b->size = bytes;
  b->small = size <= kSmallSize;
  ++d.segments;
  d.stats.reserved_bytes += static_cast<int64_t>(bytes);
  d.stats.peak_reserved_bytes = std::max(d.stats.peak_reserved_bytes, d.stats.reserved_bytes);
  return b;
}

void CachingAllocator::split(DeviceCache& d, Block* block, size_t size) {
  const size_t rest = block->size - size;
  const bool worth_it = block->small ? rest >= kMinBlock : rest > kSmallSize;
  if (!worth_it) return;
  auto* r = new Block;
  r->device = block->device;
  r->stream = block->stream;
  r->ptr = block->ptr + size;
  r->size = rest;
  r->small = block->small;
  r->prev = block;
  r->next = block->next;
  if (block->next != nullptr) block->next->prev = r;
  block->next = r;
  block->size = size;
  d.pool(r).insert(r);
}

void CachingAllocator::free_block(DeviceCache& d, Block* block) {
  block->state = BlockState::kFree;
  block->uses.clear();
  auto& pool = d.pool(block);
  if (Block* p = block->prev; p != nullptr && p->state == BlockState::kFree) {
    pool.erase(p);
    p->size += block->size;
    p->next = block->next;
    if (block->next != nullptr) block->next->prev = p;
    delete block;
    block = p;
  }
  if (Block* n = block->next; n != nullptr && n->state == BlockState::kFree) {
    pool.erase(n);
    block->size += n->size;
    block->next = n->next;
    if (n->next != nullptr) n->next->prev = block;
    delete n;
  }
  pool.insert(block);
}

void CachingAllocator::process_pending(DeviceCache& d) {
  for (auto it = d.pending.begin(); it != d.pending.end();) {
    std::deque<DeviceCache::PendingFree>& queue = it->second;
    while (!queue.empty() && d.memory->event_complete(queue.front().event)) {
      const DeviceCache::PendingFree done = queue.front();
      queue.pop_front();
      d.memory->destroy_event(done.event);
      if (--done.block->pending_uses == 0) {
        --d.pending_blocks;
        free_block(d, done.block);
      }
    }
    it = queue.empty() ? d.pending.erase(it) : std::next(it);
  }
}

int64_t CachingAllocator::release_free_segments(DeviceCache& d) {
  int64_t released = 0;
  for (auto* pool : {&d.small_free, &d.large_free}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {  // part of a segment still in use
        ++it;
        continue;
      }
      it = pool->erase(it);
      d.memory->free(b->ptr);
      d.stats.reserved_bytes -= static_cast<int64_t>(b->size);
      released += static_cast<int64_t>(b->size);
      --d.segments;
      delete b;
    }
  }
  return released;
}

void* CachingAllocator::allocate(size_t bytes, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceCache& d = cache_of(stream.device().index);
  process_pending(d);
  const size_t size = round_size(bytes);
  Block* b = take_free_block(d, stream, size);
  if (b == nullptr) b = new_segment(d, stream, size, bytes);
  split(d, b, size);
  b->state = BlockState::kLive;
  allocated_[b->ptr] = b;
  ++d.stats.allocations;
  d.stats.allocated_bytes += static_cast<int64_t>(b->size);
  d.stats.peak_allocated_bytes = std::max(d.stats.peak_allocated_bytes, d.stats.allocated_bytes);
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) {
    log_error(LogComponent::kTensor,
              "{} allocator: free of {} which it did not allocate (or "
              "freed twice); ignored",
              name_, ptr);
    return;
  }
  Block* b = it->second;
  allocated_.erase(it);
  DeviceCache& d = *devices_[b->device];
  ++d.stats.frees;
  d.stats.allocated_bytes -= static_cast<int64_t>(b->size);
  if (b->uses.empty()) {
    free_block(d, b);
    return;
  }
  // Other streams may still be using the memory: reuse waits for their work issued so far.
  std::vector<void*> events;
  try {
    for (const Stream& s : b->uses) events.push_back(d.memory->record_event(s));
  } catch (const std::exception& e) {
    // Without the events nothing says when the memory is safe to reuse: keep it out of use.
    log_error(LogComponent::kTensor,
              "{} allocator: cannot record the free of {} on the streams "
              "that used it ({}); its {} bytes stay reserved",
              name_, ptr, e.what(), b->size);
    b->state = BlockState::kPending;
    for (void* ev : events) d.memory->destroy_event(ev);
    return;
  }
  b->state = BlockState::kPending;
  b->pending_uses = static_cast<int>(events.size());
  ++d.pending_blocks;
  for (size_t i = 0; i < events.size(); ++i) {
    d.pending[b->uses[i].id()].push_back({events[i], b});
  }
}

void CachingAllocator::record_stream(void* ptr, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  TESSEL_CHECK(it != allocated_.end(), InvalidArgument,
               "record_stream: {} is not live memory of the {} allocator", ptr, name_);
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) {
    b->uses.push_back(stream);
  }
}

MemoryStats CachingAllocator::stats(int device_index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_index < 0 || static_cast<size_t>(device_index) >= devices_.size() ||
      !devices_[device_index]) {
    return {};
  }
  return devices_[device_index]->stats;
}

void CachingAllocator::reset_peak_stats(int device_index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_index < 0 || static_cast<size_t>(device_index) >= devices_.size() ||
      !devices_[device_index]) {
    return;
  }
  MemoryStats& s = devices_[device_index]->stats;
  s.peak_allocated_bytes = s.allocated_bytes;
  s.peak_reserved_bytes = s.reserved_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& d : devices_) {
    if (!d) continue;
    process_pending(*d);
    release_free_segments(*d);
  }
}

CacheInfo CachingAllocator::info(const DeviceCache& d) const {
  CacheInfo c;
  c.segments = d.segments;
  for (const auto* pool : {&d.small_free, &d.large_free}) {
    for (const Block* b : *pool) {
      ++c.free_blocks;
      c.free_bytes += static_cast<int64_t>(b->size);
      c.largest_free = std::max(c.largest_free, static_cast<int64_t>(b->size));
    }
  }
  c.pending_blocks = d.pending_blocks;
  return c;
}

CacheInfo CachingAllocator::cache_info(int device_index) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_index < 0 || static_cast<size_t>(device_index) >= devices_.size() ||
      !devices_[device_index]) {
    return {};
  }
  return info(*devices_[device_index]);
}

void CachingAllocator::throw_out_of_memory(DeviceCache& d, const Stream& stream, size_t requested,
                                           size_t segment) {
  ++d.stats.failures;
  const CacheInfo c = info(d);
  std::string device_state;
  try {
    device_state = d.memory->describe();
  } catch (const std::exception& e) {
    device_state = fmt::format("unknown ({})", e.what());
  }
  throw OutOfMemory(fmt::format(
      "{} out of memory: cannot allocate {} ({} bytes requested; a new segment of {}) on {} "
      "for {}; device: {}; allocator: {}, {} segments, {} cached in {} free blocks (largest "
      "{}), {} freed blocks waiting for other streams; the cache was emptied and the "
      "allocation retried once. Free tensors that are no longer needed or use smaller batches",
      name_, bytes_str(static_cast<int64_t>(requested)), requested,
      bytes_str(static_cast<int64_t>(segment)), stream.device().str(), stream.str(), device_state,
      d.stats.str(), c.segments, bytes_str(c.free_bytes), c.free_blocks, bytes_str(c.largest_free),
      c.pending_blocks));
}

}  // namespace tessel::cuda
