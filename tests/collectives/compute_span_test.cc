// ComputeSpan on the CPU, and on a pretend CUDA device whose events the test completes: a host
// span runs from construction to end(); a device span stays started until the watchdog sees its
// end event complete, then takes its duration from the events (as an NCCL call does); the
// watchdog's poll leaves errors kernels recorded on the device to the issuing thread; nothing is
// recorded while the recorder is disabled.

#include "tessel/collectives/compute_span.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device_test_util.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel {
namespace {

using testing::eventually;

// The pretend device's events: the test says when each completes and at what device time.
struct PretendEvent {
  std::atomic<bool> done{false};
  std::atomic<bool> recorded{false};
  std::atomic<int64_t> at_ns{0};           // device time when it completed
  std::atomic<int> completion_queries{0};  // the watchdog's looks at it
};

class PretendCuda final : public DeviceRuntime {
 public:
  DeviceType device_type() const override { return DeviceType::kCUDA; }
  int device_count() const override { return 1; }
  Stream default_stream(int index) override { return Stream(Device::cuda(index), 0, nullptr); }
  Stream create_stream(int index, int) override { return Stream(Device::cuda(index), 1, nullptr); }
  bool query_stream(const Stream&) override { return true; }
  void synchronize_stream(const Stream&) override {}
  void* create_event(int, bool) override {
    std::lock_guard lock(mutex_);
    events_.push_back(std::make_unique<PretendEvent>());
    return events_.back().get();
  }
  void destroy_event(void*) noexcept override {}  // kept for the test to look at
  void record_event(void* event, const Stream&) override {
    static_cast<PretendEvent*>(event)->recorded = true;
  }
  void stream_wait_event(const Stream&, void*) override {}
  // What a thread that issued work calls: it would report kernels' errors. Never the watchdog's.
  bool query_event(void* event) override {
    ++reporting_queries;
    return static_cast<PretendEvent*>(event)->done;
  }
  bool query_event_completion(void* event) override {
    if (broken) throw CommError("cudaEventQuery: an illegal memory access was encountered");
    auto* e = static_cast<PretendEvent*>(event);
    ++e->completion_queries;
    return e->done;
  }
  void synchronize_event(void*) override {}
  Nanoseconds event_elapsed(void* start, void* end) override {
    return Nanoseconds(static_cast<PretendEvent*>(end)->at_ns -
                       static_cast<PretendEvent*>(start)->at_ns);
  }
  void synchronize_device(int) override {}

  // The newest `n` events, oldest first.
  std::vector<PretendEvent*> newest(size_t n) {
    std::lock_guard lock(mutex_);
    std::vector<PretendEvent*> out;
    for (size_t i = events_.size() - n; i < events_.size(); ++i) out.push_back(events_[i].get());
    return out;
  }

  std::atomic<int> reporting_queries{0};
  std::atomic<bool> broken{false};

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<PretendEvent>> events_;
};

// Registered once for the process (this test binary has no other CUDA use), never destroyed:
// events outlive the tests in the watchdog's hands.
PretendCuda& pretend_cuda() {
  static PretendCuda* runtime = [] {
    auto* r = new PretendCuda;
    register_device_runtime(DeviceType::kCUDA, r);
    return r;
  }();
  return *runtime;
}

fr::Entry entry(uint64_t id) {
  fr::Entry e;
  EXPECT_TRUE(fr::FlightRecorder::global().read_entry(id, e)) << "record " << id;
  return e;
}

class ComputeSpanTest : public ::testing::Test {
 protected:
  void SetUp() override { fr::FlightRecorder::global().set_enabled(true); }
  void TearDown() override { fr::FlightRecorder::global().set_enabled(true); }
};

TEST_F(ComputeSpanTest, HostSpanRunsFromConstructionToEnd) {
  ComputeSpan span("fsdp forward transformer.h.1");
  ASSERT_TRUE(span.active());
  const uint64_t id = span.record_id();
  fr::Entry e = entry(id);
  EXPECT_EQ(e.op, fr::OpType::kUserSpan);
  EXPECT_EQ(e.state, fr::EntryState::kStarted);
  EXPECT_STREQ(e.text, "fsdp forward transformer.h.1");
  span.end();
  EXPECT_FALSE(span.active());
  e = entry(id);
  EXPECT_EQ(e.state, fr::EntryState::kCompleted);
  EXPECT_GE(e.completed_ns, e.started_ns);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  span.end();  // idempotent: the completion stays (reads of cycle ticks may differ by a tick)
  EXPECT_NEAR(static_cast<double>(entry(id).completed_ns), static_cast<double>(e.completed_ns),
              1e6);
}

TEST_F(ComputeSpanTest, MovingHandsTheSpanOverAndAssigningEndsTheOldOne) {
  ComputeSpan first("first");
  const uint64_t first_id = first.record_id();
  ComputeSpan moved(std::move(first));
  EXPECT_FALSE(first.active());  // NOLINT(bugprone-use-after-move): the contract under test
  EXPECT_EQ(moved.record_id(), first_id);
  EXPECT_EQ(entry(first_id).state, fr::EntryState::kStarted);
  moved = ComputeSpan("second");
  EXPECT_EQ(entry(first_id).state, fr::EntryState::kCompleted);
  const uint64_t second_id = moved.record_id();
  { ComputeSpan scoped = std::move(moved); }
  EXPECT_EQ(entry(second_id).state, fr::EntryState::kCompleted);
}

TEST_F(ComputeSpanTest, DisabledRecorderMakesNoSpan) {
  fr::FlightRecorder& recorder = fr::FlightRecorder::global();
  recorder.set_enabled(false);
  const uint64_t before = recorder.recorded();
  ComputeSpan span("not recorded", Device::cuda(0));
  EXPECT_FALSE(span.active());
  span.end();
  EXPECT_EQ(recorder.recorded(), before);
}

TEST_F(ComputeSpanTest, DeviceSpanTakesItsDurationFromTheEventsOnceTheWatchdogSeesThem) {
  PretendCuda& cuda = pretend_cuda();
  ComputeSpan span("fsdp backward transformer.h.0", Device::cuda(0));
  const uint64_t id = span.record_id();
  span.end();
  const std::vector<PretendEvent*> events = cuda.newest(2);  // begin, end
  ASSERT_TRUE(events[0]->recorded && events[1]->recorded);
  // The device has not run it yet: the span stays open, however often the watchdog looks.
  ASSERT_TRUE(
      eventually([&] { return events[0]->completion_queries + events[1]->completion_queries >= 3; },
                 std::chrono::seconds(30)));
  EXPECT_EQ(entry(id).state, fr::EntryState::kStarted);
  events[0]->at_ns = 1'000'000;
  events[1]->at_ns = 4'000'000;  // 3 ms of device time
  events[0]->done = true;
  events[1]->done = true;
  ASSERT_TRUE(eventually([&] { return entry(id).state == fr::EntryState::kCompleted; }));
  const fr::Entry e = entry(id);
  EXPECT_NEAR(static_cast<double>(e.completed_ns - e.started_ns), 3e6, 1e4);
  EXPECT_EQ(cuda.reporting_queries, 0) << "the watchdog took the issuing thread's errors";
}

TEST_F(ComputeSpanTest, DeviceThatFailsItsQueryFailsTheSpan) {
  PretendCuda& cuda = pretend_cuda();
  ComputeSpan span("fsdp forward transformer.h.2", Device::cuda(0));
  const uint64_t id = span.record_id();
  cuda.broken = true;
  span.end();
  EXPECT_TRUE(eventually([&] { return entry(id).state == fr::EntryState::kFailed; }));
  cuda.broken = false;
}

}  // namespace
}  // namespace tessel
