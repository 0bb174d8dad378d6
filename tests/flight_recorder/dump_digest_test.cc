#include "tessel/flight_recorder/internal/dump_digest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "test_util.h"

namespace tessel::fr::internal {
namespace {

using testing::TempDir;

// What the fold may hold for `groups` groups: each one's window and its two pinned entries.
constexpr size_t held_bound(size_t groups) { return groups * (kHeldPerGroup + 2); }

TraceEntry op(uint64_t group, OpType type, uint64_t seq, int64_t step, int64_t now) {
  TraceEntry e;
  e.group_id = group;
  e.op = type;
  if (type == OpType::kSend) {
    e.peer = 1;
    e.p2p_seq = seq;
  } else {
    e.seq = seq;
  }
  e.step = step;
  e.input = TensorMeta::make("f32", {1024});
  e.output = e.input;
  e.enqueued_ns = now;
  e.completed_ns = now + 10;
  e.state = EntryState::kCompleted;
  return e;
}

// 100,000 entries of three groups (two of collectives, one of sends) and user events: the fold
// never holds more than the window, yet keeps what the rules read of the whole ring.
TEST(RankFoldTest, HoldsAWindowPerGroupOfALongRing) {
  const DumpSet none;
  Digest digest(none);
  RankFold fold(digest);
  constexpr int64_t kSteps = 20'000;  // five entries per step
  uint64_t seq1 = 0, seq2 = 0, sends = 0;
  uint32_t index = 0;
  size_t most = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    TraceEntry marker;
    marker.op = OpType::kUserEvent;
    marker.text = "step " + std::to_string(step);
    fold.fold(marker);
    fold.fold(op(1, OpType::kAllReduce, ++seq1, step, step * 100));
    fold.fold(op(1, OpType::kAllReduce, ++seq1, step, step * 100 + 20));
    TraceEntry second = op(2, OpType::kAllGather, ++seq2, step, step * 100 + 40);
    if (step == 3) second.state = EntryState::kStarted;  // never completes: pinned
    fold.fold(second);
    fold.fold(op(3, OpType::kSend, ++sends, step, step * 100 + 60));
    index += 5;
    most = std::max(most, fold.held());
  }
  EXPECT_LE(most, held_bound(3));

  RankDump header;
  header.rank = 0;
  header.world_size = 2;
  header.recorded = index;
  GroupInfo pair{1, "pair", {0, 1}};
  const RankDigest r = fold.finish(header, {&pair});
  EXPECT_LE(r.held.size(), held_bound(3));
  EXPECT_TRUE(
      std::is_sorted(r.held.begin(), r.held.end(),
                     [](const HeldEntry& a, const HeldEntry& b) { return a.index < b.index; }));
  // The unfinished all_gather of step 3 stays, however old.
  ASSERT_FALSE(r.held.empty());
  EXPECT_EQ(r.held.front().group_id, 2u);
  EXPECT_EQ(r.held.front().seq, 4u);
  EXPECT_FALSE(r.held.front().finished());
  EXPECT_EQ(r.held.back().index, index - 1);  // the newest operation
  EXPECT_EQ(r.entries, index);
  EXPECT_EQ(r.last_event, "step " + std::to_string(kSteps - 1));
  // Summaries of the whole ring.
  const GroupHistory* h1 = r.history(1);
  ASSERT_NE(h1, nullptr);
  EXPECT_EQ(h1->reached, seq1);
  EXPECT_EQ(h1->in_ring, seq1);
  EXPECT_EQ(h1->in_window, kHeldPerGroup);
  ASSERT_EQ(h1->steps.size(), 1u);  // two a step, every step: one run
  EXPECT_EQ(h1->steps[0].first, 0);
  EXPECT_EQ(h1->steps[0].last, kSteps - 1);
  EXPECT_EQ(h1->steps[0].count, 2);
  EXPECT_EQ(count_at(h1->steps, 777), 2);
  EXPECT_EQ(count_at(h1->steps, kSteps), 0);
  ASSERT_EQ(r.p2p.size(), 1u);
  EXPECT_EQ(r.p2p[0].first, 1u);
  EXPECT_EQ(r.p2p[0].last, sends);
  // One call per argument list, shared by every entry that made it.
  EXPECT_EQ(digest.call(r.held.back().call).op, OpType::kSend);
  // The alignment records hold a member bit, not an entry, per collective.
  const auto& aligned = digest.alignments();
  ASSERT_EQ(aligned.count(1), 1u);
  EXPECT_EQ(aligned.at(1).keys.size(), seq1);
  const auto classes = digest.classes(1, {5, 0});
  ASSERT_EQ(classes.size(), 1u);
  EXPECT_EQ(classes[0].ranks, std::vector<int>{0});
}

// A step counts the training loop's collectives only: entries of a scoped thread (a purpose),
// even with a step of their own, stay out of the tally, and their call names the purpose.
TEST(RankFoldTest, ScopedThreadsCollectivesStayOutOfTheStepCounts) {
  const DumpSet none;
  Digest digest(none);
  RankFold fold(digest);
  fold.fold(op(1, OpType::kAllReduce, 1, 0, 100));
  fold.fold(op(1, OpType::kAllReduce, 2, 1, 200));
  TraceEntry writer = op(1, OpType::kAllGather, 3, 1, 250);
  writer.purpose = "checkpoint writer";
  fold.fold(writer);
  fold.fold(op(1, OpType::kAllReduce, 4, 2, 300));
  RankDump header;
  header.rank = 0;
  header.world_size = 2;
  header.recorded = 4;
  GroupInfo pair{1, "pair", {0, 1}};
  const RankDigest r = fold.finish(header, {&pair});
  const GroupHistory* h = r.history(1);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(count_at(h->steps, 0), 1);
  EXPECT_EQ(count_at(h->steps, 1), 1);  // not 2: the writer's all_gather is not the step's
  EXPECT_EQ(count_at(h->steps, 2), 1);
  const auto gathered =
      std::find_if(r.held.begin(), r.held.end(), [](const HeldEntry& e) { return e.seq == 3; });
  ASSERT_NE(gathered, r.held.end());
  EXPECT_EQ(digest.call(gathered->call).purpose, "checkpoint writer");
}

std::vector<int> iota_ranks(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

// Full rings written by the recorder and read back from disk: each rank's digest holds its
// windows, not its ring, and the verdict is the one of the set read whole.
TEST(DigestTest, ReadingFullRingsHoldsTheWindowsNotTheRings) {
  TempDir dir;
  constexpr int kRanks = 3;
  RecorderOptions ro;
  ro.capacity = 8192;
  for (int r = 0; r < kRanks; ++r) {
    FlightRecorder fr(ro);
    fr.set_process_info(r, kRanks);
    fr.register_group(1, "world", iota_ranks(kRanks));
    const uint64_t self = 10 + static_cast<uint64_t>(r);
    fr.register_group(self, "self", {r});
    for (int64_t step = 0; step < 3000; ++step) {  // three entries a step: the ring wraps
      fr.set_step(step);
      fr.record_event("step begins");
      for (uint64_t group : {uint64_t{1}, self}) {
        RecordArgs a;
        a.group_id = group;
        a.seq = static_cast<uint64_t>(step) + 1;
        a.input = TensorMeta::make("f32", {64});
        fr.completed(fr.record(a));
      }
    }
    write_dump(fr, {}, dir.path());
  }
  const auto digest = Digest::read(dir.path(), -1);
  ASSERT_EQ(digest->set().dumps.size(), static_cast<size_t>(kRanks));
  for (size_t i = 0; i < kRanks; ++i) {
    EXPECT_EQ(digest->rank_digest(i).entries, ro.capacity);
    EXPECT_LE(digest->rank_digest(i).held.size(), held_bound(2));
  }
  EXPECT_LE(digest->held_entries(), kRanks * held_bound(2));
  EXPECT_TRUE(digest->set().dumps[0].entries.empty());

  const Verdict whole = analyze(read_dump_dir(dir.path()));
  const Verdict streamed = analyze_dump_dir(dir.path()).verdict;
  EXPECT_EQ(streamed.status, VerdictStatus::kHealthy) << format_verdict(streamed);
  EXPECT_EQ(verdict_to_json(streamed), verdict_to_json(whole));
}

// A dump set aside after the reader folded it (here a second dump of rank 1, whose all_reduce
// disagrees with rank 0's) must leave nothing behind: the directory is folded again without it.
TEST(DigestTest, DumpSetAsideAfterFoldingLeavesNoTrace) {
  TempDir dir;
  auto dump_text = [](int rank, int64_t numel) {
    FlightRecorder fr(RecorderOptions{8});
    fr.set_process_info(rank, 2);
    fr.register_group(1, "world", {0, 1});
    RecordArgs a;
    a.group_id = 1;
    a.seq = 1;
    a.input = TensorMeta::make("f32", {numel});
    fr.completed(fr.record(a));
    return dump_to_string(fr, {});
  };
  std::ofstream(dir.path() / "tessel_fr_rank0.json") << dump_text(0, 8);
  std::ofstream(dir.path() / "tessel_fr_rank1.json") << dump_text(1, 8);
  std::ofstream(dir.path() / "tessel_fr_rank1x.json") << dump_text(1, 16);  // after rank1.json

  const DirAnalysis streamed = analyze_dump_dir(dir.path());
  ASSERT_EQ(streamed.set.problems.size(), 1u);
  EXPECT_NE(streamed.set.problems[0].message.find("rank 1 is also dumped"), std::string::npos);
  EXPECT_EQ(streamed.verdict.status, VerdictStatus::kHealthy) << format_verdict(streamed.verdict);
  EXPECT_EQ(verdict_to_json(streamed.verdict), verdict_to_json(analyze(read_dump_dir(dir.path()))));
}

}  // namespace
}  // namespace tessel::fr::internal
