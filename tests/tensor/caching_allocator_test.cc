// The caching allocator behind CUDA memory (tensor/cuda/caching_allocator.h), driven by a fake
// device with a fixed capacity and hand-completed events: rounding and pools, splitting and
// merging, per-stream reuse, the stream rule (record_stream holds a block until the recorded
// streams pass its free), statistics, empty_cache, and the out-of-memory retry and message.
// Runs in every build; the same allocator on a real GPU is checked by tests/gpu.
#include "tessel/tensor/cuda/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "tessel/base/error.h"

namespace tessel::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Device memory from the host heap, up to `capacity` bytes; events complete when the test says.
// Not thread-safe by itself: the allocator calls it under its lock.
class FakeDevice final : public DeviceMemory {
 public:
  struct State {
    size_t capacity = 64 * kMiB;
    size_t used = 0;
    std::map<void*, size_t> segments;
    std::map<int*, Stream> events;  // live events and the stream each was recorded on
    std::set<int*> completed;
    std::vector<int*> recorded;  // live events in the order they were recorded
    int64_t events_recorded = 0;
    int64_t event_queries = 0;
  };
  explicit FakeDevice(State* state) : s_(state) {}

  void* allocate(size_t bytes) override {
    if (s_->used + bytes > s_->capacity) return nullptr;
    void* p = std::aligned_alloc(512, bytes);
    s_->used += bytes;
    s_->segments[p] = bytes;
    return p;
  }
  void free(void* ptr) noexcept override {
    s_->used -= s_->segments.at(ptr);
    s_->segments.erase(ptr);
    std::free(ptr);
  }
  void* record_event(const Stream& stream) override {
    int* e = new int(0);
    s_->events.emplace(e, stream);
    s_->recorded.push_back(e);
    ++s_->events_recorded;
    return e;
  }
  bool event_complete(void* event) override {
    ++s_->event_queries;
    return s_->completed.count(static_cast<int*>(event)) > 0;
  }
  void destroy_event(void* event) noexcept override {
    int* e = static_cast<int*>(event);
    s_->events.erase(e);
    s_->completed.erase(e);
    std::erase(s_->recorded, e);
    delete e;
  }
  std::string describe() override {
    return fmt::format("fake device has {} free of {}", bytes_str(int64_t(s_->capacity - s_->used)),
                       bytes_str(int64_t(s_->capacity)));
  }

 private:
  State* s_;
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CachingAllocatorTest()
      : allocator_(DeviceType::kCUDA, "fake",
                   [this](int index) { return std::make_unique<FakeDevice>(&devices_[index]); }) {}

  // Completes every event recorded on `stream` so far.
  void complete(const Stream& stream) {
    for (auto& [e, s] : devices_[stream.device().index].events) {
      if (s == stream) devices_[stream.device().index].completed.insert(e);
    }
  }

  // Completes the first `n` events recorded on `stream` that are not complete yet (a stream
  // passes its events in order).
  void complete_first(const Stream& stream, int n) {
    FakeDevice::State& d = devices_[stream.device().index];
    for (int* e : d.recorded) {
      if (n == 0) return;
      if (d.events.at(e) == stream && d.completed.insert(e).second) --n;
    }
  }

  std::map<int, FakeDevice::State> devices_;
  CachingAllocator allocator_;
  const Stream s0_{Device::cuda(0), 0, nullptr};
  const Stream s1_{Device::cuda(0), 1, nullptr};
  const Stream s2_{Device::cuda(0), 2, nullptr};
};

TEST_F(CachingAllocatorTest, RoundsRequestsAndSizesSegments) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_size(11 * kMiB + 1), 12 * kMiB);
}

TEST_F(CachingAllocatorTest, SmallBlocksShareASegment_ZeroBytesGetUniquePointers) {
  void* a = allocator_.allocate(0, s0_);
  void* b = allocator_.allocate(100, s0_);
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 512);
  const MemoryStats st = allocator_.stats(0);
  EXPECT_EQ(st.allocated_bytes, 1024);
  EXPECT_EQ(st.reserved_bytes, int64_t(2 * kMiB));
  EXPECT_EQ(st.allocations, 2);
  EXPECT_EQ(allocator_.cache_info(0).segments, 1);
  allocator_.deallocate(a, 0);
  allocator_.deallocate(b, 100);
  EXPECT_EQ(allocator_.stats(0).allocated_bytes, 0);
  EXPECT_EQ(allocator_.stats(0).frees, 2);
}

TEST_F(CachingAllocatorTest, FreedBlockIsReusedAtOnceOnItsStream) {
  void* a = allocator_.allocate(4096, s0_);
  allocator_.deallocate(a, 4096);
  EXPECT_EQ(allocator_.allocate(4096, s0_), a);
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(2 * kMiB));
}

TEST_F(CachingAllocatorTest, AnotherStreamNeverGetsTheBlock) {
  void* a = allocator_.allocate(4096, s1_);
  allocator_.deallocate(a, 4096);
  void* b = allocator_.allocate(4096, s2_);
  EXPECT_NE(b, a);
  EXPECT_EQ(allocator_.cache_info(0).segments, 2);  // s2 took its own segment
}

// The stream rule: a block another stream used is held until that stream passes the free.
TEST_F(CachingAllocatorTest, RecordedStreamHoldsTheBlockUntilItsEventCompletes) {
  void* a = allocator_.allocate(4096, s1_);
  allocator_.record_stream(a, s2_);
  allocator_.record_stream(a, s2_);  // once is enough
  allocator_.record_stream(a, s1_);  // its own stream: nothing to wait for
  allocator_.deallocate(a, 4096);
  EXPECT_EQ(devices_[0].events_recorded, 1);
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 1);
  void* b = allocator_.allocate(4096, s1_);
  EXPECT_NE(b, a) << "reused before s2 passed the free";
  complete(s2_);
  void* c = allocator_.allocate(4096, s1_);
  EXPECT_EQ(c, a);
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 0);
  EXPECT_TRUE(devices_[0].events.empty()) << "events are destroyed once complete";
}

// Pending frees are checked per stream in the order they were recorded, up to the first event
// not complete: an allocation costs the frees it releases plus one query per stream, not a
// query per pending block.
TEST_F(CachingAllocatorTest, PendingFreesAreCheckedPerStreamUpToTheFirstIncompleteEvent) {
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) {
    blocks.push_back(allocator_.allocate(4096, s0_));
    allocator_.record_stream(blocks.back(), s1_);
  }
  void* both = allocator_.allocate(4096, s0_);  // used by s1 and s2
  allocator_.record_stream(both, s1_);
  allocator_.record_stream(both, s2_);
  for (void* b : blocks) allocator_.deallocate(b, 4096);
  allocator_.deallocate(both, 4096);
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 65);

  devices_[0].event_queries = 0;
  void* x = allocator_.allocate(4096, s0_);
  EXPECT_EQ(devices_[0].event_queries, 2) << "one query per stream: its first pending free";
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 65);

  complete_first(s1_, 10);
  devices_[0].event_queries = 0;
  allocator_.deallocate(allocator_.allocate(4096, s0_), 4096);
  EXPECT_EQ(devices_[0].event_queries, 10 + 1 + 1);  // s1: ten done and one not; s2: one
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 55);

  // A block two streams used waits for both.
  complete(s1_);
  allocator_.deallocate(allocator_.allocate(4096, s0_), 4096);
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 1);
  complete(s2_);
  allocator_.deallocate(allocator_.allocate(4096, s0_), 4096);
  EXPECT_EQ(allocator_.cache_info(0).pending_blocks, 0);
  EXPECT_TRUE(devices_[0].events.empty()) << "events are destroyed once complete";
  allocator_.deallocate(x, 4096);
}

TEST_F(CachingAllocatorTest, FreeNeighboursMergeBackIntoTheSegment) {
  void* a = allocator_.allocate(1000, s0_);
  void* b = allocator_.allocate(1000, s0_);
  void* c = allocator_.allocate(1000, s0_);
  allocator_.deallocate(b, 1000);
  EXPECT_EQ(allocator_.cache_info(0).free_blocks, 2);  // b and the rest of the segment
  allocator_.deallocate(a, 1000);
  allocator_.deallocate(c, 1000);
  const CacheInfo info = allocator_.cache_info(0);
  EXPECT_EQ(info.free_blocks, 1);
  EXPECT_EQ(info.largest_free, int64_t(2 * kMiB));
}

TEST_F(CachingAllocatorTest, LargeRequestsUseTheLargePoolAndSplitWhatIsWorthKeeping) {
  void* a = allocator_.allocate(5 * kMiB, s0_);
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(20 * kMiB));
  EXPECT_EQ(allocator_.stats(0).allocated_bytes, int64_t(5 * kMiB));
  void* b = allocator_.allocate(14 * kMiB, s0_);  // fits the 15 MiB rest of the segment
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 5 * kMiB);
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(20 * kMiB));
  void* c = allocator_.allocate(512 * 1024, s0_);  // small pool: a segment of its own
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(22 * kMiB));
  // The last 1 MiB of the large segment was not split off (not more than 1 MiB): b holds it.
  EXPECT_EQ(allocator_.stats(0).allocated_bytes, int64_t(20 * kMiB + 512 * 1024));
  for (void* p : {a, b, c}) allocator_.deallocate(p, 0);
}

TEST_F(CachingAllocatorTest, EmptyCacheGivesBackOnlyWholeFreeSegments) {
  void* a = allocator_.allocate(1000, s0_);
  void* b = allocator_.allocate(30 * kMiB, s0_);
  allocator_.deallocate(b, 0);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(2 * kMiB));
  EXPECT_EQ(devices_[0].segments.size(), 1u);
  allocator_.deallocate(a, 0);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, 0);
  EXPECT_TRUE(devices_[0].segments.empty());
}

TEST_F(CachingAllocatorTest, PendingBlocksAreReleasedByEmptyCacheOnceComplete) {
  void* a = allocator_.allocate(8 * kMiB, s1_);
  allocator_.record_stream(a, s2_);
  allocator_.deallocate(a, 0);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(20 * kMiB)) << "still in use by s2";
  complete(s2_);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, 0);
}

TEST_F(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheRetriesOnceThenNamesTheState) {
  devices_[0].capacity = 24 * kMiB;
  void* a = allocator_.allocate(20 * kMiB, s0_);
  allocator_.deallocate(a, 0);                    // cached
  void* b = allocator_.allocate(22 * kMiB, s0_);  // needs the cached 20 MiB back
  EXPECT_EQ(allocator_.stats(0).cache_flushes, 1);
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, int64_t(22 * kMiB));
  try {
    allocator_.allocate(10 * kMiB, s0_);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    for (const char* part : {"fake out of memory", "cannot allocate 10.0 MiB", "10485760 bytes",
                             "cuda:0 stream 0", "fake device has 2.0 MiB free of 24.0 MiB",
                             "allocated 22.0 MiB", "reserved 22.0 MiB", "1 segments"}) {
      EXPECT_NE(m.find(part), std::string::npos) << "missing '" << part << "' in: " << m;
    }
  }
  EXPECT_EQ(allocator_.stats(0).failures, 1);
  EXPECT_EQ(allocator_.stats(0).cache_flushes, 2);
  allocator_.deallocate(b, 0);
}

TEST_F(CachingAllocatorTest, PeaksAndStatisticsArePerDevice) {
  const Stream other{Device::cuda(1), 0, nullptr};
  void* a = allocator_.allocate(3 * kMiB, s0_);
  void* b = allocator_.allocate(kMiB, other);
  allocator_.deallocate(a, 0);
  EXPECT_EQ(allocator_.stats(0).peak_allocated_bytes, int64_t(3 * kMiB));
  EXPECT_EQ(allocator_.stats(0).allocated_bytes, 0);
  EXPECT_EQ(allocator_.stats(1).allocated_bytes, int64_t(kMiB));
  allocator_.reset_peak_stats(0);
  EXPECT_EQ(allocator_.stats(0).peak_allocated_bytes, 0);
  EXPECT_EQ(allocator_.stats(0).peak_reserved_bytes, int64_t(20 * kMiB));
  EXPECT_EQ(allocator_.stats(7).allocations, 0);  // a device never used
  allocator_.deallocate(b, 0);
}

TEST_F(CachingAllocatorTest, RecordStreamOfUnknownMemoryIsAnError) {
  int x = 0;
  EXPECT_THROW(allocator_.record_stream(&x, s1_), InvalidArgument);
}

TEST_F(CachingAllocatorTest, ThreadsAllocatingAndFreeingAtOnceLeaveNothingAllocated) {
  devices_[0].capacity = size_t{1} << 30;  // room for any fragmentation
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      std::mt19937 rng(t);
      const Stream s{Device::cuda(0), t % 2, nullptr};
      std::vector<void*> held;
      for (int i = 0; i < 500; ++i) {
        held.push_back(
            allocator_.allocate(std::uniform_int_distribution<size_t>(1, 3 * kMiB)(rng), s));
        if (held.size() > 4) {
          allocator_.deallocate(held.front(), 0);
          held.erase(held.begin());
        }
      }
      for (void* p : held) allocator_.deallocate(p, 0);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allocator_.stats(0).allocated_bytes, 0);
  EXPECT_EQ(allocator_.stats(0).allocations, 2000);
  EXPECT_EQ(allocator_.stats(0).frees, 2000);
  allocator_.empty_cache();
  EXPECT_EQ(allocator_.stats(0).reserved_bytes, 0);
  EXPECT_TRUE(devices_[0].segments.empty());
}

}  // namespace
}  // namespace tessel::cuda
