// The device event pool (tensor/cuda/event_pool.h) over counting fake hooks: an event released
// is the next one acquired for its (device, timing), other keys get their own, a full free list
// destroys what comes back, the pool destroys its free events, and threads share it safely.
#include "tessel/tensor/cuda/event_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

namespace tessel::cuda {
namespace {

struct FakeEvents {
  int64_t created = 0, destroyed = 0;
  std::set<int*> live;
  std::mutex mutex;
  EventPool::Hooks hooks() {
    return {.create =
                [this](int, bool) {
                  std::lock_guard lock(mutex);
                  ++created;
                  int* e = new int(0);
                  live.insert(e);
                  return static_cast<void*>(e);
                },
            .destroy =
                [this](void* e) {
                  std::lock_guard lock(mutex);
                  ++destroyed;
                  live.erase(static_cast<int*>(e));
                  delete static_cast<int*>(e);
                }};
  }
};

TEST(EventPoolTest, ReleasedEventIsReusedForItsDeviceAndTiming) {
  FakeEvents fake;
  {
    EventPool pool(fake.hooks());
    void* a = pool.acquire(0, false);
    pool.release(a);
    EXPECT_EQ(pool.acquire(0, false), a);
    EXPECT_NE(pool.acquire(0, true), a) << "a timed event is another kind";
    EXPECT_NE(pool.acquire(1, false), a) << "another device's";
    pool.release(a);
    // A thousand operations, each taking two events and giving them back: two creations.
    for (int i = 0; i < 1000; ++i) {
      void* start = pool.acquire(2, true);
      void* end = pool.acquire(2, true);
      pool.release(start);
      pool.release(end);
    }
    const EventPool::Counts c = pool.counts();
    EXPECT_EQ(c.created, 5);  // a, the timed one, device 1's, and device 2's two
    EXPECT_EQ(c.reused, 1 + 1998);
    EXPECT_EQ(c.destroyed, 0);
    EXPECT_EQ(c.free, 3);
    EXPECT_EQ(fake.created, 5);
  }
  EXPECT_EQ(fake.destroyed, 3) << "the pool destroys its free events (two are still out)";
}

TEST(EventPoolTest, FullFreeListDestroysWhatComesBack_UnknownEventsAreIgnored) {
  FakeEvents fake;
  EventPool pool(fake.hooks(), /*max_free_per_key=*/2);
  std::vector<void*> out;
  for (int i = 0; i < 5; ++i) out.push_back(pool.acquire(0, false));
  for (void* e : out) pool.release(e);
  EXPECT_EQ(pool.counts().free, 2);
  EXPECT_EQ(pool.counts().destroyed, 3);
  EXPECT_EQ(fake.live.size(), 2u);
  int stranger = 0;
  pool.release(&stranger);  // logged, not destroyed, not pooled
  pool.release(nullptr);
  EXPECT_EQ(pool.counts().free, 2);
}

TEST(EventPoolTest, ThreadsShareThePool) {
  FakeEvents fake;
  EventPool pool(fake.hooks());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) pool.release(pool.acquire(0, false));
    });
  }
  for (auto& t : threads) t.join();
  const EventPool::Counts c = pool.counts();
  EXPECT_LE(c.created, 4) << "at most one event per thread at a time";
  EXPECT_EQ(c.created + c.reused, 8000);
  EXPECT_EQ(c.free, c.created);
}

}  // namespace
}  // namespace tessel::cuda
