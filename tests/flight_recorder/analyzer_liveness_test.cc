// How a rank ended decides whether it is a culprit: a crash before any failed operation is one;
// a rank whose own operation failed first (then died of the unhandled error, or exited) waited;
// a rank that exited by itself is named only when another rank waits for it.
#include <gtest/gtest.h>
#include <signal.h>

#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"

namespace tessel::fr {
namespace {

constexpr int64_t kS = 1'000'000'000;
constexpr int kWorld = 3;

// One collective entry of group 1 ("world": every rank).
TraceEntry all_reduce(uint64_t seq, EntryState state, int64_t enqueued, int64_t completed) {
  TraceEntry e;
  e.record_id = seq;
  e.group_id = 1;
  e.seq = seq;
  e.op = OpType::kAllReduce;
  e.reduce_op = ReduceOp::kSum;
  e.state = state;
  e.step = static_cast<int64_t>(seq);
  e.input = e.output = TensorMeta::make("f32", {4});
  e.enqueued_ns = e.started_ns = enqueued;
  e.completed_ns = completed;
  return e;
}

// A rank's dump at `at` (monotonic ns, shared by every rank here), after `entries`.
RankDump dump(int rank, DumpTrigger trigger, std::string reason, std::vector<TraceEntry> entries,
              int64_t at) {
  RankDump d;
  d.version = kDumpFormatVersion;
  d.rank = rank;
  d.world_size = kWorld;
  d.trigger = trigger;
  d.reason = std::move(reason);
  d.monotonic_ns = at;
  d.wall_time_us = 1'760'000'000'000'000 + at / 1000;
  d.capacity = 64;
  d.recorded = entries.size();
  d.groups = {GroupInfo{1, "world", {0, 1, 2}}};
  d.entries = std::move(entries);
  return d;
}

// Two finished steps, then step 2's all_reduce: `done` says who completed it.
std::vector<TraceEntry> history() {
  return {all_reduce(1, EntryState::kCompleted, 1 * kS, 1 * kS + 1000),
          all_reduce(2, EntryState::kCompleted, 2 * kS, 2 * kS + 1000)};
}

TEST(AnalyzerLivenessTest, RanksThatExitedByThemselvesBeforeAnyCollectiveAreNoHang) {
  // Every rank's ring was recovered after it exited with status 1 (a configuration error).
  DumpSet set;
  set.world_size = kWorld;
  for (int r = 0; r < kWorld; ++r) {
    set.dumps.push_back(dump(r, DumpTrigger::kRecovered, "exit status 1", history(), 3 * kS));
    set.exits.push_back({r, 1, 0, 1'760'000'000'000'000 + 3'000'000});
  }
  const Verdict v = analyze(set);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.status, VerdictStatus::kHealthy);
  EXPECT_TRUE(v.culprits.empty());
  for (const auto& p : v.positions) EXPECT_EQ(p.where, RankPosition::Where::kExited);
}

TEST(AnalyzerLivenessTest, ARankThatExitedWhileOthersWaitIsTheCulprit) {
  DumpSet set;
  set.world_size = kWorld;
  for (int r : {0, 2}) {
    auto entries = history();
    entries.push_back(all_reduce(3, EntryState::kFailed, 3 * kS, 5 * kS));  // timed out
    set.dumps.push_back(dump(r, DumpTrigger::kFatalSignal, "signal 6", entries, 5 * kS));
  }
  set.dumps.insert(set.dumps.begin() + 1,
                   dump(1, DumpTrigger::kRecovered, "exit status 3", history(), 5 * kS));
  set.exits.push_back({1, 3, 0, 1'760'000'000'000'000 + 3'000'000});
  const Verdict v = analyze(set);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.status, VerdictStatus::kCulpritFound);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.positions[1].where, RankPosition::Where::kExited);
  EXPECT_EQ(v.positions[0].where, RankPosition::Where::kInOperation);
}

TEST(AnalyzerLivenessTest, ACrashBeforeAnyFailureIsACrashAndItsVictimsAreNot) {
  DumpSet set;
  set.world_size = kWorld;
  for (int r : {0, 2}) {
    auto entries = history();
    entries.push_back(all_reduce(3, EntryState::kFailed, 3 * kS, 3 * kS + kS / 10));  // lost it
    set.dumps.push_back(dump(r, DumpTrigger::kFatalSignal, "signal 6", entries, 4 * kS));
  }
  set.dumps.insert(set.dumps.begin() + 1,
                   dump(1, DumpTrigger::kFatalSignal, "signal 11", history(), 3 * kS));
  const Verdict v = analyze(set);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.positions[1].where, RankPosition::Where::kCrashed);
  EXPECT_NE(v.positions[1].summary.find("SIGSEGV"), std::string::npos);
  for (int r : {0, 2}) EXPECT_EQ(v.positions[r].where, RankPosition::Where::kInOperation);
}

// A rank stopped (SIGSTOP, a debugger, swapping) before a collective and resumed after the
// others timed out in it: it issues the call late, fails at once, and its prefetches queue up
// behind it (FSDP). Its queued calls are consequences; the late call is where it was.
TEST(AnalyzerLivenessTest, ARankResumedAfterTheOthersGaveUpIsLateEvenWithCallsQueuedBehind) {
  DumpSet set;
  set.world_size = kWorld;
  for (int r : {0, 2}) {
    auto entries = history();
    entries.push_back(all_reduce(3, EntryState::kFailed, 3 * kS, 7 * kS));  // timed out at 4 s
    entries.push_back(all_reduce(4, EntryState::kFailed, 3 * kS + 1000, 7 * kS + 1000));
    set.dumps.push_back(dump(r, DumpTrigger::kStoreRequest, "launcher", entries, 7 * kS + kS / 2));
  }
  auto late = history();
  late.push_back(all_reduce(3, EntryState::kFailed, 10 * kS, 10 * kS + 1'000'000));
  late.push_back(all_reduce(4, EntryState::kScheduled, 10 * kS + 2'000'000, 0));
  set.dumps.insert(set.dumps.begin() + 1,
                   dump(1, DumpTrigger::kStoreRequest, "launcher", late, 10 * kS + 3'000'000));
  const Verdict v = analyze(set);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.positions[1].where, RankPosition::Where::kLate);
  for (int r : {0, 2}) {
    EXPECT_NE(v.positions[r].summary.find("all_reduce #3"), std::string::npos)
        << "rank " << r << " waited in the first call that failed, not in what queued behind";
  }
}

// A rank stopped inside a collective (it issued it in time): the others time out after the
// group's timeout; it fails there only when it runs again, having "waited" far longer.
TEST(AnalyzerLivenessTest, ARankStoppedInsideACollectiveIsNamedAndTheOthersAreNot) {
  DumpSet set;
  set.world_size = kWorld;
  for (int r : {0, 2}) {
    auto entries = history();
    entries.push_back(all_reduce(3, EntryState::kFailed, 3 * kS, 7 * kS));
    set.dumps.push_back(dump(r, DumpTrigger::kStoreRequest, "launcher", entries, 7 * kS + kS / 2));
  }
  auto stalled = history();
  stalled.push_back(all_reduce(3, EntryState::kFailed, 3 * kS + kS / 10, 15 * kS));
  set.dumps.insert(set.dumps.begin() + 1,
                   dump(1, DumpTrigger::kStoreRequest, "launcher", stalled, 15 * kS + kS / 10));
  const Verdict v = analyze(set);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.status, VerdictStatus::kCulpritFound);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_NE(v.positions[1].summary.find("stopped inside all_reduce #3"), std::string::npos);
}

// Every member waited as long as the others and gave up together: nothing singles one out (a
// transport problem), and nobody is blamed.
TEST(AnalyzerLivenessTest, MembersThatGaveUpTogetherAreNotCalledStalled) {
  DumpSet set;
  set.world_size = kWorld;
  for (int r = 0; r < kWorld; ++r) {
    auto entries = history();
    entries.push_back(all_reduce(3, EntryState::kFailed, 3 * kS + r * 1000, 7 * kS + r * 2000));
    set.dumps.push_back(dump(r, DumpTrigger::kStoreRequest, "launcher", entries, 7 * kS + kS / 2));
  }
  const Verdict v = analyze(set);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.status, VerdictStatus::kInconclusive);
}

}  // namespace
}  // namespace tessel::fr
