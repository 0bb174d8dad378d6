// The order in which calls on different groups reach their transport. For a backend that
// issues_in_process_order() (NCCL, whose kernels of several communicators on one GPU can wait
// for each other), every collective, async ones too, reaches the transport at issue, on the
// calling thread, one at a time over all such groups of the process: the transport sees the
// program's order, the same on every rank. send/recv keep to their group's thread. For other
// backends async calls run on each group's worker, so a later call on one group can overtake an
// earlier one on another (checked as the contrast).

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/process_group.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using std::chrono::seconds;

// What reached the transports of a test's groups, in order.
struct TransportLog {
  std::mutex mutex;
  std::vector<std::string> calls;        // "<group>:<op>"
  std::vector<std::thread::id> threads;  // the thread each ran on
  std::atomic<int> inside{0};            // calls now in a transport
  std::atomic<int> most_inside{0};
  // While closed, a transport call of a group named "gated" waits (the first one only).
  std::condition_variable gate_cv;
  std::condition_variable reached_cv;  // notified when a call is logged
  bool gate_open = true;
  bool gated_once = false;
};

class RecordingBackend final : public CommBackend {
 public:
  RecordingBackend(std::string group, bool ordered, TransportLog* log, int size = 1)
      : group_(std::move(group)), ordered_(ordered), log_(log), size_(size) {}
  std::string_view name() const override { return "recording"; }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  bool issues_in_process_order() const override { return ordered_; }
  void all_reduce(Tensor&, ReduceOp, const OpContext&) override { reach("all_reduce"); }
  void broadcast(Tensor&, int, const OpContext&) override { reach("broadcast"); }
  void all_gather(const Tensor&, Tensor&, std::span<const int64_t>, const OpContext&) override {
    reach("all_gather");
  }
  void reduce_scatter(const Tensor&, Tensor&, std::span<const int64_t>, ReduceOp,
                      const OpContext&) override {
    reach("reduce_scatter");
  }
  void all_to_all(const Tensor&, Tensor&, std::span<const int64_t>, std::span<const int64_t>,
                  const OpContext&) override {
    reach("all_to_all");
  }
  void send(const Tensor&, int, int, const OpContext&) override { reach("send"); }
  void recv(Tensor&, int, int, const OpContext&) override { reach("recv"); }
  void barrier(const OpContext&) override { reach("barrier"); }
  std::unique_ptr<CommBackend> split(const SplitRequest&) override { return nullptr; }

 private:
  void reach(const char* op) {
    const int now = ++log_->inside;
    for (int most = log_->most_inside; now > most;) {
      if (log_->most_inside.compare_exchange_weak(most, now)) break;
    }
    {
      std::unique_lock lock(log_->mutex);
      log_->calls.push_back(group_ + ":" + op);
      log_->threads.push_back(std::this_thread::get_id());
      log_->reached_cv.notify_all();
      if (group_ == "gated" && !log_->gated_once) {
        log_->gated_once = true;
        log_->gate_cv.wait_for(lock, seconds(30), [&] { return log_->gate_open; });
      }
    }
    std::this_thread::yield();  // give an overlapping call the chance to show
    --log_->inside;
  }
  const std::string group_;
  const bool ordered_;
  TransportLog* log_;
  const int size_;
};

std::shared_ptr<ProcessGroup> group(const std::string& name, uint64_t id, bool ordered,
                                    TransportLog* log) {
  return std::make_shared<ProcessGroup>(
      std::make_unique<RecordingBackend>(name, ordered, log),
      ProcessGroupOptions{.name = name, .id = id, .timeout = seconds(30)}, std::vector<int>{0});
}

TEST(IssueOrderTest, AsyncCallsOnSeveralGroupsReachTheTransportInIssueOrder) {
  TransportLog log;
  auto dp = group("dp", 9701, /*ordered=*/true, &log);
  auto tp = group("tp", 9702, /*ordered=*/true, &log);
  auto cp = group("cp", 9703, /*ordered=*/true, &log);
  Tensor t = zeros({4});
  Tensor out = zeros({4});
  std::vector<Work> works;
  works.push_back(dp->all_gather(t, out, {.async = true}));
  works.push_back(tp->all_reduce(t, {.async = true}));
  works.push_back(dp->reduce_scatter(out, t, {.async = true}));
  works.push_back(cp->broadcast(t, {.async = true}));
  tp->barrier();
  works.push_back(cp->all_reduce(t, {.async = true}));
  works.push_back(dp->all_reduce(t, {.async = true}));
  for (Work& w : works) w.wait(seconds(30));
  EXPECT_EQ(log.calls, (std::vector<std::string>{"dp:all_gather", "tp:all_reduce",
                                                 "dp:reduce_scatter", "cp:broadcast", "tp:barrier",
                                                 "cp:all_reduce", "dp:all_reduce"}));
  for (std::thread::id id : log.threads) EXPECT_EQ(id, std::this_thread::get_id());
}

// send/recv keep their group's order only: in a ring over per-direction groups every rank
// sends first, and a send may wait in the transport for the peer's receive.
TEST(IssueOrderTest, AsyncSendAndRecvStayOnTheirGroupsThread) {
  TransportLog log;
  // Two ranks, of which only this one runs: the recording backend moves nothing.
  auto pair = std::make_shared<ProcessGroup>(
      std::make_unique<RecordingBackend>("pair", /*ordered=*/true, &log, /*size=*/2),
      ProcessGroupOptions{.name = "pair", .id = 9731, .timeout = seconds(30)},
      std::vector<int>{0, 1});
  auto dp = group("dp", 9732, /*ordered=*/true, &log);
  Tensor t = zeros({4});
  Work sent = pair->send(t, 1, {.async = true});
  Work received = pair->recv(t, 1, {.async = true});
  sent.wait(seconds(30));
  received.wait(seconds(30));
  dp->all_reduce(t, {.async = true}).wait(seconds(30));
  EXPECT_EQ(log.calls, (std::vector<std::string>{"pair:send", "pair:recv", "dp:all_reduce"}));
  ASSERT_EQ(log.threads.size(), 3u);
  EXPECT_NE(log.threads[0], std::this_thread::get_id()) << "send runs on the group's thread";
  EXPECT_NE(log.threads[1], std::this_thread::get_id()) << "recv runs on the group's thread";
  EXPECT_EQ(log.threads[2], std::this_thread::get_id()) << "a collective runs at issue";
}

TEST(IssueOrderTest, CallsFromSeveralThreadsReachOrderedTransportsOneAtATime) {
  TransportLog log;
  auto a = group("a", 9711, /*ordered=*/true, &log);
  auto b = group("b", 9712, /*ordered=*/true, &log);
  constexpr int kCalls = 200;
  auto issue = [&](const std::shared_ptr<ProcessGroup>& g) {
    Tensor t = zeros({2});
    for (int i = 0; i < kCalls; ++i) g->all_reduce(t, {.async = i % 2 == 0}).wait(seconds(30));
  };
  std::thread ta(issue, a), tb(issue, b);
  ta.join();
  tb.join();
  EXPECT_EQ(log.calls.size(), 2u * kCalls);
  EXPECT_EQ(log.most_inside.load(), 1) << "two ordered transports were entered at once";
}

// The contrast, and why the rule exists: without it, an async call queued behind a slow one on
// its group reaches the transport after a call issued later on another group.
TEST(IssueOrderTest, UnorderedBackendLetsALaterCallOnAnotherGroupOvertake) {
  TransportLog log;
  auto gated = group("gated", 9721, /*ordered=*/false, &log);
  auto other = group("other", 9722, /*ordered=*/false, &log);
  {
    std::lock_guard lock(log.mutex);
    log.gate_open = false;
  }
  Tensor t = zeros({4});
  Work first = gated->all_reduce(t, {.async = true});  // held in the transport
  {
    std::unique_lock lock(log.mutex);
    ASSERT_TRUE(log.reached_cv.wait_for(lock, seconds(30), [&] { return !log.calls.empty(); }));
  }
  Work second = gated->broadcast(t, {.async = true});  // queued behind it
  other->all_reduce(t);                                // issued last, runs now
  {
    std::lock_guard lock(log.mutex);
    log.gate_open = true;
  }
  log.gate_cv.notify_all();
  first.wait(seconds(30));
  second.wait(seconds(30));
  EXPECT_EQ(log.calls,
            (std::vector<std::string>{"gated:all_reduce", "other:all_reduce", "gated:broadcast"}));
}

}  // namespace
}  // namespace tessel
