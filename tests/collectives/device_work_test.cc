// Operations with a device part, on the CPU: a backend that "enqueues" every call on a pretend
// device whose end events the test completes. Checks what the NCCL backend relies on without a
// GPU: a call returns once enqueued, wait() only makes the caller's stream wait, synchronize()
// blocks until the event, the watchdog polls the events (sleeping between polls), completes the
// Work and the flight-recorder entry with the device-measured duration, times hung ones out and
// aborts their group, and tensors stay referenced until their event completed.

#include "tessel/collectives/device_work.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "device_test_util.h"
#include "tessel/base/error.h"
#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/process_group.h"
#include "tessel/collectives/watchdog.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::contains;
using testing::eventually;

// What the test sees of one enqueued call: its pretend end event.
struct FakeEvent {
  std::atomic<bool> done{false};
  std::atomic<bool> fail{false};      // query() throws PeerLost, like a lost NCCL peer
  std::atomic<int> stream_waits{0};   // wait_on_current_stream() calls
  std::atomic<bool> released{false};  // the device part, and its tensor references, are gone
  Nanoseconds elapsed = milliseconds(3);
};

class FakeDeviceWork final : public DeviceWork {
 public:
  FakeDeviceWork(std::shared_ptr<FakeEvent> event, Tensor tensor)
      : event_(std::move(event)), tensor_(std::move(tensor)) {}
  ~FakeDeviceWork() override { event_->released = true; }
  bool query() override {
    if (event_->fail) throw PeerLost("peer 1 went away");
    return event_->done;
  }
  void wait_on_current_stream() override { ++event_->stream_waits; }
  Nanoseconds elapsed() override { return event_->elapsed; }

 private:
  std::shared_ptr<FakeEvent> event_;
  Tensor tensor_;
};

// A group of one whose calls all leave a FakeDeviceWork behind.
class FakeDeviceBackend final : public CommBackend {
 public:
  explicit FakeDeviceBackend(std::string kind) : kind_(std::move(kind)) {}
  std::string_view name() const override { return kind_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(Tensor& t, ReduceOp, const OpContext& ctx) override { enqueue(t, ctx); }
  void broadcast(Tensor& t, int, const OpContext& ctx) override { enqueue(t, ctx); }
  void all_gather(const Tensor& in, Tensor&, std::span<const int64_t>,
                  const OpContext& ctx) override {
    enqueue(in, ctx);
  }
  void reduce_scatter(const Tensor& in, Tensor&, std::span<const int64_t>, ReduceOp,
                      const OpContext& ctx) override {
    enqueue(in, ctx);
  }
  void all_to_all(const Tensor& in, Tensor&, std::span<const int64_t>, std::span<const int64_t>,
                  const OpContext& ctx) override {
    enqueue(in, ctx);
  }
  void send(const Tensor& t, int, int, const OpContext& ctx) override { enqueue(t, ctx); }
  void recv(Tensor& t, int, int, const OpContext& ctx) override { enqueue(t, ctx); }
  void barrier(const OpContext&) override {}
  std::unique_ptr<CommBackend> split(const SplitRequest&) override { return nullptr; }
  void abort(const std::string&) override { ++aborts; }
  void abort_together(std::span<CommBackend* const> backends, const std::string&) override {
    ++together_calls;
    together_size = static_cast<int>(backends.size());
    for (CommBackend* b : backends) ++static_cast<FakeDeviceBackend*>(b)->aborts;
  }

  std::shared_ptr<FakeEvent> event(size_t i) {
    std::lock_guard lock(mutex_);
    return events_.at(i);
  }

  std::atomic<int> aborts{0};
  std::atomic<int> together_calls{0};
  std::atomic<int> together_size{0};

 private:
  void enqueue(const Tensor& t, const OpContext& ctx) {
    auto event = std::make_shared<FakeEvent>();
    {
      std::lock_guard lock(mutex_);
      events_.push_back(event);
    }
    *ctx.device_work = std::make_unique<FakeDeviceWork>(event, t);
  }
  const std::string kind_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<FakeEvent>> events_;
};

std::shared_ptr<ProcessGroup> make_group(const std::string& name, uint64_t id,
                                         Nanoseconds timeout = seconds(30),
                                         std::string kind = "fake_device") {
  return std::make_shared<ProcessGroup>(
      std::make_unique<FakeDeviceBackend>(std::move(kind)),
      ProcessGroupOptions{.name = name, .id = id, .timeout = timeout}, std::vector<int>{0});
}

FakeDeviceBackend& fake(const std::shared_ptr<ProcessGroup>& pg) {
  return static_cast<FakeDeviceBackend&>(pg->backend());
}

fr::Entry entry_of(const Work& w) {
  fr::Entry e;
  EXPECT_TRUE(fr::FlightRecorder::global().read_entry(w.state()->record_id(), e));
  return e;
}

// Restores the global watchdog's hook and policy after a test.
class DeviceWorkTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Watchdog::global().set_dump_hook(nullptr);
    Watchdog::global().set_policy(WatchdogPolicy::kRaise);
  }
};

TEST_F(DeviceWorkTest, BlockingCallReturnsOnceEnqueued_CompletesWithItsEvent) {
  auto pg = make_group("dev", 9101);
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t);  // returns once the caller's stream waits for it
  auto event = fake(pg).event(0);
  EXPECT_EQ(event->stream_waits, 1);
  EXPECT_FALSE(w.is_completed());
  EXPECT_FALSE(event->released);
  EXPECT_EQ(entry_of(w).state, fr::EntryState::kStarted);

  std::this_thread::sleep_for(milliseconds(10));  // longer than the device time, as on a device
  event->done = true;
  // Completed by the watchdog's poll: wait_for itself polls nothing.
  ASSERT_TRUE(w.state()->wait_for(seconds(5)));
  EXPECT_TRUE(w.is_success());
  EXPECT_TRUE(event->released);
  EXPECT_EQ(w.state()->device_time(), milliseconds(3));
  // Completed when the watchdog saw it; started the device-measured time before.
  ASSERT_TRUE(eventually([&] { return entry_of(w).state == fr::EntryState::kCompleted; }));
  const fr::Entry e = entry_of(w);
  EXPECT_NEAR(e.completed_ns - e.started_ns, 3'000'000, 2'000);
  EXPECT_GE(e.started_ns, e.enqueued_ns);
  EXPECT_LE(e.completed_ns, monotonic_ns());
}

TEST_F(DeviceWorkTest, WaitDoesNotBlockTheHost_SynchronizeDoes) {
  auto pg = make_group("dev", 9102);
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t, {.async = true});
  Stopwatch clock;
  EXPECT_TRUE(w.wait(seconds(5)));  // the host part only
  auto event = fake(pg).event(0);
  EXPECT_EQ(event->stream_waits, 1);
  EXPECT_FALSE(w.is_completed());
  EXPECT_LT(clock.elapsed(), seconds(1));

  // The device finishes a while later (how long does not matter): synchronize returns only
  // after it has.
  std::thread device([&] {
    std::this_thread::sleep_for(milliseconds(100));
    event->done = true;
  });
  EXPECT_TRUE(w.synchronize(seconds(30)));
  EXPECT_TRUE(event->done) << "synchronize returned before the device finished";
  device.join();
  EXPECT_TRUE(w.is_completed());
  EXPECT_TRUE(event->released);
  // A completed device part needs no stream wait.
  w.wait();
  EXPECT_EQ(event->stream_waits, 1);
}

TEST_F(DeviceWorkTest, CallsInFlightCompleteEachWithItsOwnEvent) {
  auto pg = make_group("dev", 9103);
  Tensor t = zeros({4});
  std::vector<Work> works;
  for (int i = 0; i < 3; ++i) works.push_back(pg->all_reduce(t, {.async = true}));
  for (Work& w : works) w.wait();
  fake(pg).event(1)->done = true;
  ASSERT_TRUE(works[1].state()->wait_for(seconds(5)));
  EXPECT_FALSE(works[0].is_completed());
  EXPECT_FALSE(works[2].is_completed());
  fake(pg).event(0)->done = true;
  fake(pg).event(2)->done = true;
  for (Work& w : works) EXPECT_TRUE(w.synchronize(seconds(5)));
  EXPECT_EQ(works[2].state()->seq(), 3u);
}

TEST_F(DeviceWorkTest, HungCallTimesOutAbortsTheGroup_WatchdogSleepsBetweenPolls) {
  std::mutex mutex;
  std::vector<WatchdogEvent> dumps;
  Watchdog::global().set_dump_hook([&](const WatchdogEvent& e) {
    std::lock_guard lock(mutex);
    dumps.push_back(e);
  });
  auto pg = make_group("hung", 9104, seconds(1));
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t);  // its event never completes
  const testing::HangOutcome hang = testing::synchronize_hung(w);
  EXPECT_TRUE(contains(hang.error, "all_reduce #1 on group 'hung'"));
  EXPECT_TRUE(contains(hang.error, "did not complete within its timeout of 1s (watchdog)"));
  EXPECT_GE(hang.hung, milliseconds(900));
  EXPECT_TRUE(testing::watchdog_stayed_idle(hang));  // polled every 2 ms, sleeping between
  // Aborted although the policy is raise: only an abort stops a device kernel waiting for peers.
  // The watchdog fails the call first and aborts the backend right after (watchdog.cc: the
  // abort may release a blocked backend call, which must find the call already failed), so the
  // backend's abort can land just after the caller woke.
  EXPECT_TRUE(pg->aborted());
  EXPECT_TRUE(testing::eventually([&] { return fake(pg).aborts.load() >= 1; }));
  EXPECT_EQ(fake(pg).aborts, 1);
  {
    std::lock_guard lock(mutex);
    ASSERT_EQ(dumps.size(), 1u);
    EXPECT_EQ(dumps[0].kind, ErrorKind::kTimeout);
    EXPECT_EQ(dumps[0].seq, 1u);
  }
  EXPECT_EQ(entry_of(w).state, fr::EntryState::kFailed);
  // The tensor stays referenced until the device is done with it.
  auto event = fake(pg).event(0);
  EXPECT_FALSE(event->released);
  event->done = true;
  EXPECT_TRUE(eventually([&] { return event->released.load(); }));
  EXPECT_TRUE(w.state()->failed());
}

TEST_F(DeviceWorkTest, DeviceErrorFailsTheWorkAndAbortsTheGroup) {
  std::atomic<int> dumps{0};
  Watchdog::global().set_dump_hook([&](const WatchdogEvent& e) {
    if (e.kind == ErrorKind::kPeerLost) ++dumps;
  });
  auto pg = make_group("lossy", 9105);
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t);
  fake(pg).event(0)->fail = true;
  try {
    w.synchronize(seconds(5));
    FAIL() << "a call whose device part failed returned from synchronize()";
  } catch (const PeerLost& e) {
    EXPECT_TRUE(
        contains(e.what(),
                 "all_reduce #1 on group 'lossy' (world ranks 0) (world rank 0; group rank 0 "
                 "of 1): peer 1 went away"));
  }
  EXPECT_EQ(dumps, 1);
  EXPECT_TRUE(pg->aborted());
  EXPECT_THROW(pg->all_reduce(t), CommError);
}

TEST_F(DeviceWorkTest, AbortFailsCallsInFlight_TensorsKeptUntilTheirEventsComplete) {
  auto pg = make_group("stop", 9106);
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t);
  pg->abort("stopping the job");
  try {
    w.wait();
    FAIL() << "a call in flight on an aborted group succeeded";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "group was aborted: stopping the job"));
  }
  EXPECT_EQ(entry_of(w).state, fr::EntryState::kFailed);
  auto event = fake(pg).event(0);
  EXPECT_FALSE(event->released);
  event->done = true;  // the aborted kernel ends: its end event completes, the data means nothing
  EXPECT_TRUE(eventually([&] { return event->released.load(); }));
  EXPECT_TRUE(w.state()->failed());
  EXPECT_EQ(entry_of(w).state, fr::EntryState::kFailed);
}

TEST_F(DeviceWorkTest, AbortTogetherTakesEachBackendKindInOneCall) {
  auto a = make_group("a", 9201);
  auto b = make_group("b", 9202);
  auto c = make_group("c", 9203, seconds(30), "other_device");
  Tensor t = zeros({4});
  Work in_flight = b->all_reduce(t);
  const std::vector<std::shared_ptr<ProcessGroup>> groups = {a, b, c, a, nullptr};
  ProcessGroup::abort_together(groups, "mesh abort");
  EXPECT_EQ(fake(a).together_calls + fake(b).together_calls, 1);
  EXPECT_EQ(fake(a).together_size + fake(b).together_size, 2);
  EXPECT_EQ(fake(c).together_calls, 1);
  EXPECT_EQ(fake(c).together_size, 1);
  for (const auto& g : {a, b, c}) {
    EXPECT_TRUE(g->aborted());
    EXPECT_EQ(fake(g).aborts, 1);
  }
  EXPECT_THROW(in_flight.wait(), CommError);
  EXPECT_THROW(a->all_reduce(t), CommError);
  ProcessGroup::abort_together(groups, "again");  // already aborted: nothing more
  EXPECT_EQ(fake(c).together_calls, 1);
  fake(b).event(0)->done = true;
}

}  // namespace
}  // namespace tessel
