// The watchdog: fails work past its timeout with an error naming group, op, seq and the missing
// ranks; calls the dump hook; applies the raise / abort_communicator policies.

#include "tessel/collectives/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>

#include "tessel/collectives/comm_backend.h"
#include "tessel/collectives/process_group.h"

namespace tessel {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A backend whose calls block until it is aborted (bounded at 30 s), like an MPI call waiting
// for a rank that never comes. It knows rank 1 is missing.
class HangingBackend final : public CommBackend {
 public:
  std::string_view name() const override { return "hanging"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce(Tensor&, ReduceOp, const OpContext&) override { block(); }
  void broadcast(Tensor&, int, const OpContext&) override { block(); }
  void all_gather(const Tensor&, Tensor&, std::span<const int64_t>, const OpContext&) override {
    block();
  }
  void reduce_scatter(const Tensor&, Tensor&, std::span<const int64_t>, ReduceOp,
                      const OpContext&) override {
    block();
  }
  void all_to_all(const Tensor&, Tensor&, std::span<const int64_t>, std::span<const int64_t>,
                  const OpContext&) override {
    block();
  }
  void send(const Tensor&, int, int, const OpContext&) override { block(); }
  void recv(Tensor&, int, int, const OpContext&) override { block(); }
  void barrier(const OpContext&) override { block(); }
  std::unique_ptr<CommBackend> split(const SplitRequest&) override { return nullptr; }
  std::vector<int> missing_ranks(uint64_t) const override { return {1}; }
  void abort(const std::string&) override {
    {
      std::lock_guard lock(mutex_);
      aborted_ = true;
    }
    cv_.notify_all();
  }
  bool aborted() const {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  void block() {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, seconds(30), [&] { return aborted_; });
    throw CommError("aborted");
  }
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool aborted_ = false;
};

// Restores the global watchdog's hook and policy after a test.
class WatchdogTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Watchdog::global().set_dump_hook(nullptr);
    Watchdog::global().set_policy(WatchdogPolicy::kRaise);
  }
};

TEST_F(WatchdogTest, FailsHungWorkNamingGroupOpSeqAndMissingRanks) {
  std::mutex mutex;
  std::vector<WatchdogEvent> events;
  Watchdog::global().set_dump_hook([&](const WatchdogEvent& e) {
    std::lock_guard lock(mutex);
    events.push_back(e);
  });
  auto backend = std::make_unique<HangingBackend>();
  auto pg = std::make_shared<ProcessGroup>(
      std::move(backend),
      ProcessGroupOptions{.name = "hang", .id = 77, .timeout = milliseconds(200)},
      std::vector<int>{0, 1});
  Tensor t = zeros({4});
  Work w = pg->all_reduce(t, {.async = true});
  // Releases the blocked worker however the test ends.
  struct Release {
    ProcessGroup& pg;
    ~Release() { pg.abort("test finished"); }
  } release{*pg};
  try {
    w.wait(seconds(20));
    FAIL() << "expected Timeout";
  } catch (const Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_reduce #1 on group 'hang' (world ranks 0,1)"), std::string::npos)
        << what;
    EXPECT_NE(what.find("not arrived: world rank 1 (group rank 1)"), std::string::npos) << what;
  }
  EXPECT_FALSE(pg->aborted());  // policy raise
  {
    // The hook runs before the Work is failed, so it has run by now.
    std::lock_guard lock(mutex);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].group_id, 77u);
    EXPECT_EQ(events[0].seq, 1u);
    EXPECT_EQ(events[0].kind, ErrorKind::kTimeout);
  }
}

TEST_F(WatchdogTest, AbortCommunicatorPolicyAbortsTheGroup) {
  Watchdog::global().set_policy(WatchdogPolicy::kAbortCommunicator);
  auto backend = std::make_unique<HangingBackend>();
  HangingBackend* raw = backend.get();
  auto pg = std::make_shared<ProcessGroup>(
      std::move(backend),
      ProcessGroupOptions{.name = "hang2", .id = 78, .timeout = milliseconds(100)},
      std::vector<int>{0, 1});
  Work w = pg->barrier({.async = true});
  EXPECT_THROW(w.wait(seconds(20)), Timeout);
  const Deadline deadline = Deadline::after(seconds(20));
  while (!raw->aborted() && !deadline.expired()) std::this_thread::yield();
  EXPECT_TRUE(raw->aborted());
  EXPECT_TRUE(pg->aborted());
  Tensor t = zeros({1});
  EXPECT_THROW(pg->all_reduce(t), CommError);
}

TEST(WatchdogPolicyTest, ParsesEveryNameAndRejectsOthers) {
  for (auto p : {WatchdogPolicy::kRaise, WatchdogPolicy::kAbortCommunicator,
                 WatchdogPolicy::kAbortProcess}) {
    EXPECT_EQ(parse_watchdog_policy(watchdog_policy_name(p)), p);
  }
  EXPECT_THROW(parse_watchdog_policy("explode"), InvalidArgument);
}

}  // namespace
}  // namespace tessel
