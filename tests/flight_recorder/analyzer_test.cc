#include "tessel/flight_recorder/analyzer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/internal/dump_digest.h"
#include "tessel/flight_recorder/synth.h"
#include "test_util.h"

namespace tessel::fr {
namespace {

using testing::TempDir;

// What each scenario must yield, stated from the fault it injects (not from analyzer output):
// the ranks at fault, and the kind of finding that names them.
struct Expectation {
  std::vector<int> culprits;
  VerdictStatus status;
  FindingKind kind;
  std::vector<int> suspects = {};    // inconclusive: the two sides of a symmetric fault
  std::vector<int> stragglers = {};  // information on a healthy job
};

Expectation expected(std::string_view scenario, const SynthOptions& o) {
  using K = FindingKind;
  const std::vector<int> one = {o.culprit};
  if (scenario == "healthy") return {{}, VerdictStatus::kHealthy, K::kNotJoined};
  // Two ranks take a world and a pair collective in opposite orders: only they take part in
  // both, so nothing tells which order was meant.
  if (scenario == "deadlock") {
    return {{},
            VerdictStatus::kInconclusive,
            K::kDeadlock,
            {std::min(o.culprit, o.partner), std::max(o.culprit, o.partner)}};
  }
  if (scenario == "straggler") return {{}, VerdictStatus::kHealthy, K::kNotJoined, {}, one};
  static const std::map<std::string_view, K> kinds = {
      {"skip_collective", K::kNotJoined},
      {"extra_collective", K::kExtraCollective},
      {"size_mismatch", K::kMismatch},
      {"dtype_mismatch", K::kMismatch},
      {"reduce_op_mismatch", K::kMismatch},
      {"root_mismatch", K::kMismatch},
      {"send_without_recv", K::kUnmatchedSend},
      {"killed", K::kNotJoined},
      {"stopped", K::kNotJoined},
      {"wrapped", K::kNotJoined},
      // The waiting ranks died of SIGABRT only because their timed-out collective went
      // unhandled: victims, never culprits.
      {"aborted_waiters", K::kNotJoined},
      {"late_arrival", K::kNotJoined},
      // It skipped its last world all_reduce: its world barrier meets the others' all_reduce.
      {"leave_world", K::kMismatch},
      // The skipper's neighbour waits on it; the ranks behind the neighbour wait on the
      // neighbour, and the skipper waits in the world all_reduce they never reach.
      {"ring_skip_send", K::kUnmatchedRecv},
      {"ring_skip_recv", K::kUnmatchedSend},
  };
  return {one, VerdictStatus::kCulpritFound, kinds.at(scenario)};
}

// The verdict on the set read whole; reading it as a stream (what tessel-trace does) must give
// the same one.
Verdict run_scenario(std::string_view scenario, const SynthOptions& o) {
  TempDir dir;
  synth_write(scenario, o, dir.path());
  const DumpSet set = read_dump_dir(dir.path());
  EXPECT_TRUE(set.problems.empty());
  Verdict v = analyze(set);
  const DirAnalysis streamed = analyze_dump_dir(dir.path());
  EXPECT_EQ(streamed.set.dumps.size(), set.dumps.size());
  EXPECT_EQ(verdict_to_json(streamed.verdict), verdict_to_json(v));
  return v;
}

struct Case {
  int ranks, culprit, partner;
};

class ScenarioTest : public ::testing::TestWithParam<std::tuple<std::string_view, Case>> {};

TEST_P(ScenarioTest, NamesExactlyTheRanksAtFault) {
  const auto [scenario, c] = GetParam();
  SynthOptions o;
  o.ranks = c.ranks;
  o.culprit = c.culprit;
  o.partner = c.partner;
  const Expectation want = expected(scenario, o);
  const Verdict v = run_scenario(scenario, o);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.status, want.status);
  EXPECT_EQ(v.culprits, want.culprits);  // exact: no healthy rank blamed, no culprit missed
  EXPECT_EQ(v.suspects, want.suspects);
  std::vector<int> stragglers;
  for (const auto& s : v.stragglers) stragglers.push_back(s.rank);
  EXPECT_EQ(stragglers, want.stragglers);
  if (want.status == VerdictStatus::kCulpritFound) {
    ASSERT_FALSE(v.findings.empty());
    EXPECT_EQ(v.findings[0].kind, want.kind);
    EXPECT_TRUE(v.inconclusive.empty());
  } else {
    EXPECT_TRUE(v.findings.empty());
  }
  ASSERT_EQ(v.positions.size(), static_cast<size_t>(c.ranks));
}

// World sizes 3 (odd, halves of 2 and 1), 5 and 8; culprits low and last; partners adjacent.
const Case kCases[] = {{3, 1, 2}, {3, 2, 0}, {5, 4, 1}, {8, 1, 2}, {8, 7, 6}};

std::string case_name(const ::testing::TestParamInfo<ScenarioTest::ParamType>& info) {
  const Case c = std::get<1>(info.param);
  return std::string(std::get<0>(info.param)) + "_ranks" + std::to_string(c.ranks) + "_culprit" +
         std::to_string(c.culprit);
}

bool is_mesh(std::string_view scenario) { return scenario.substr(0, 5) == "mesh_"; }

// The scenarios of the world/half/pair job (the mesh ones lay ranks out on a grid).
std::vector<std::string_view> flat_scenarios() {
  std::vector<std::string_view> out;
  for (auto s : synth_scenarios()) {
    if (!is_mesh(s)) out.push_back(s);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllScenarios, ScenarioTest,
                         ::testing::Combine(::testing::ValuesIn(flat_scenarios()),
                                            ::testing::ValuesIn(kCases)),
                         case_name);

// Mesh scenarios: a (dp, tp) grid with sibling "dp" and "tp" groups.
struct MeshCase {
  int dp, tp, culprit, partner;  // the partner is in another tp group and another dp group
};

// What each mesh fault must yield, from the fault: the ranks that changed their program.
Expectation expected_mesh(std::string_view scenario, const MeshCase& c) {
  using K = FindingKind;
  const std::vector<int> one = {c.culprit};
  // Skips and early leaves end in a cycle through the final world barrier, where the culprit
  // waits for the peers that wait for it.
  if (scenario == "mesh_skip_tp" || scenario == "mesh_leave_tp" || scenario == "mesh_leave_dp") {
    return {one, VerdictStatus::kCulpritFound, K::kDeadlock};
  }
  // Both changed their order in the same step: each waits in dp for a rank that waits in tp.
  if (scenario == "mesh_swap") {
    return {{std::min(c.culprit, c.partner), std::max(c.culprit, c.partner)},
            VerdictStatus::kCulpritFound,
            K::kDeadlock};
  }
  // The partner always took dp first (harmless alone); only the culprit changed its order.
  if (scenario == "mesh_swap_habit") return {one, VerdictStatus::kCulpritFound, K::kDeadlock};
  if (scenario == "mesh_ring_skip_send") {
    return {one, VerdictStatus::kCulpritFound, K::kUnmatchedRecv};
  }
  ADD_FAILURE() << "no expectation for " << scenario;
  return {};
}

class MeshScenarioTest : public ::testing::TestWithParam<std::tuple<std::string_view, MeshCase>> {};

TEST_P(MeshScenarioTest, NamesExactlyTheRanksAtFault) {
  const auto [scenario, c] = GetParam();
  SynthOptions o;
  o.ranks = c.dp * c.tp;
  o.tp = c.tp;
  o.culprit = c.culprit;
  o.partner = c.partner;
  const Expectation want = expected_mesh(scenario, c);
  const Verdict v = run_scenario(scenario, o);
  SCOPED_TRACE(format_verdict(v));
  EXPECT_EQ(v.status, want.status);
  EXPECT_EQ(v.culprits, want.culprits);
  EXPECT_TRUE(v.suspects.empty());
  ASSERT_FALSE(v.findings.empty());
  EXPECT_EQ(v.findings[0].kind, want.kind);
  EXPECT_TRUE(v.inconclusive.empty());
  for (const Finding& f : v.findings) {  // a rank that only waits is never blamed
    for (int r : f.culprits) {
      EXPECT_TRUE(r == c.culprit ||
                  (scenario.find("swap") != std::string_view::npos && r == c.partner))
          << "rank " << r << " blamed";
    }
  }
}

// 2x2 (where order votes alone tie), wider and taller meshes, an odd dimension; culprits first,
// last and inside.
const MeshCase kMeshCases[] = {{2, 2, 1, 2}, {2, 2, 3, 0}, {2, 4, 1, 6}, {2, 4, 6, 3},
                               {4, 2, 5, 2}, {4, 2, 0, 7}, {3, 2, 4, 1}, {2, 3, 2, 3}};

std::vector<std::string_view> mesh_scenarios() {
  std::vector<std::string_view> out;
  for (auto s : synth_scenarios()) {
    if (is_mesh(s)) out.push_back(s);
  }
  return out;
}

std::string mesh_case_name(const ::testing::TestParamInfo<MeshScenarioTest::ParamType>& info) {
  const MeshCase c = std::get<1>(info.param);
  return fmt::format("{}_{}x{}_culprit{}_partner{}", std::get<0>(info.param), c.dp, c.tp, c.culprit,
                     c.partner);
}

INSTANTIATE_TEST_SUITE_P(MeshScenarios, MeshScenarioTest,
                         ::testing::Combine(::testing::ValuesIn(mesh_scenarios()),
                                            ::testing::ValuesIn(kMeshCases)),
                         mesh_case_name);

// Spans of compute are evidence of nothing: the same dumps with a span after every entry give
// the same verdict; one left open at the end, as a rank hung in its compute would leave, changes
// only where a rank in compute is said to be (inside that span), never whom it blames.
TEST(AnalyzerTest, SpansDoNotChangeAnyVerdict) {
  SynthOptions o;
  o.ranks = 5;
  o.culprit = 4;
  o.partner = 1;
  for (std::string_view scenario : flat_scenarios()) {
    SCOPED_TRACE(scenario);
    TempDir dir;
    synth_write(scenario, o, dir.path());
    const DumpSet set = read_dump_dir(dir.path());
    auto add_spans = [&](bool open_at_end) {
      DumpSet with_spans = set;
      for (RankDump& d : with_spans.dumps) {
        std::vector<TraceEntry> entries;
        auto span = [&](int64_t at, bool open) {
          TraceEntry e;
          e.op = OpType::kUserSpan;
          e.text = "fsdp backward transformer.h.3";
          e.state = open ? EntryState::kStarted : EntryState::kCompleted;
          e.enqueued_ns = e.started_ns = at;
          e.completed_ns = open ? 0 : at + 1;
          entries.push_back(e);
        };
        for (const TraceEntry& e : d.entries) {
          entries.push_back(e);
          span(e.enqueued_ns, false);
        }
        if (open_at_end && !d.entries.empty()) span(d.entries.back().enqueued_ns, true);
        // A ring that held them all: record ids in ring order, as the recorder gives them.
        const uint64_t added = entries.size() - d.entries.size();
        const uint64_t first = d.recorded + added + 1 - entries.size();
        for (size_t i = 0; i < entries.size(); ++i) entries[i].record_id = first + i;
        d.entries = std::move(entries);
        d.recorded += added;
        d.capacity += added;
      }
      return with_spans;
    };
    const Verdict plain = analyze(set);
    EXPECT_EQ(verdict_to_json(analyze(add_spans(false))), verdict_to_json(plain));
    const Verdict open = analyze(add_spans(true));
    EXPECT_EQ(open.status, plain.status);
    EXPECT_EQ(open.culprits, plain.culprits);
    EXPECT_EQ(open.suspects, plain.suspects);
    ASSERT_EQ(open.findings.size(), plain.findings.size());
    for (size_t i = 0; i < open.findings.size(); ++i) {
      EXPECT_EQ(open.findings[i].kind, plain.findings[i].kind);
      EXPECT_EQ(open.findings[i].culprits, plain.findings[i].culprits);
      EXPECT_EQ(open.findings[i].waiting, plain.findings[i].waiting);
    }
    ASSERT_EQ(open.positions.size(), plain.positions.size());
    for (size_t r = 0; r < open.positions.size(); ++r) {
      const RankPosition& was = plain.positions[r];
      const RankPosition& now = open.positions[r];
      EXPECT_EQ(now.where, was.where) << "rank " << r;
      // In compute (or a stale dump's rank that was): now inside the open span.
      if (was.summary.find("in compute for ") != std::string::npos ||
          was.summary.find("in compute;") != std::string::npos) {
        EXPECT_NE(now.summary.find("in compute: fsdp backward transformer.h.3 for "),
                  std::string::npos)
            << "rank " << r << ": " << now.summary;
      } else {
        EXPECT_EQ(now.summary, was.summary) << "rank " << r;
      }
    }
  }
}

TEST(AnalyzerTest, NamesUserEventOfTheCulprit) {
  SynthOptions o;
  o.ranks = 4;
  o.culprit = 3;
  o.steps = 7;
  const Verdict v = run_scenario("skip_collective", o);
  ASSERT_EQ(v.culprits, std::vector<int>{3});
  EXPECT_EQ(v.positions[3].last_event, "step 6 begins");
  EXPECT_NE(format_verdict(v).find("last marked 'step 6 begins'"), std::string::npos);
  EXPECT_NE(verdict_to_json(v).find("\"last_event\": \"step 6 begins\""), std::string::npos);
}

TEST(AnalyzerTest, TwoRankTieIsInconclusiveNotABlame) {
  SynthOptions o;
  o.ranks = 2;
  o.culprit = 1;
  o.partner = 0;
  for (auto scenario : {"skip_collective", "extra_collective", "size_mismatch"}) {
    const Verdict v = run_scenario(scenario, o);
    SCOPED_TRACE(format_verdict(v));
    EXPECT_EQ(v.status, VerdictStatus::kInconclusive) << scenario;
    EXPECT_TRUE(v.culprits.empty()) << scenario;
    EXPECT_FALSE(v.inconclusive.empty()) << scenario;
  }
}

TEST(AnalyzerTest, SingleRankJobIsHealthy) {
  SynthOptions o;
  o.ranks = 1;
  o.culprit = 0;
  o.partner = 0;
  const Verdict v = run_scenario("healthy", o);
  EXPECT_EQ(v.status, VerdictStatus::kHealthy);
  EXPECT_EQ(v.positions.size(), 1u);
}

int64_t g_now_ns = 5'000'000'000;
int64_t fake_clock() noexcept { return g_now_ns; }
int64_t fake_wall() noexcept { return 1'700'000'000'000'000 + g_now_ns / 1000; }

// Three ranks; ranks 0 and 1 entered all_reduce #1 `age` before the dump, rank 2 has not.
DumpSet live_job(std::chrono::nanoseconds age, DumpTrigger trigger, const TempDir& dir) {
  RecorderOptions ro;
  ro.capacity = 16;
  ro.clock = fake_clock;
  ro.wall_clock = fake_wall;
  const int64_t dump_at = g_now_ns + age.count();
  for (int r = 0; r < 3; ++r) {
    FlightRecorder fr(ro);
    fr.set_process_info(r, 3);
    fr.register_group(1, "world", {0, 1, 2});
    if (r < 2) {
      RecordArgs a;
      a.group_id = 1;
      a.seq = 1;
      a.input = TensorMeta::make("f32", {8});
      fr.started(fr.record(a));
    }
    const int64_t saved = g_now_ns;
    g_now_ns = dump_at;
    write_dump(fr, {trigger, r == 0 ? 0 : -1, ""}, dir.path());
    g_now_ns = saved;
  }
  return read_dump_dir(dir.path());
}

TEST(AnalyzerTest, YoungPendingOpsOfALiveJobBlameNobody) {
  TempDir dir;
  const DumpSet set = live_job(std::chrono::milliseconds(200), DumpTrigger::kSignal, dir);
  const Verdict v = analyze(set);
  EXPECT_EQ(v.status, VerdictStatus::kHealthy) << format_verdict(v);
  AnalyzerOptions strict;
  strict.min_wait = std::chrono::nanoseconds(0);
  EXPECT_EQ(analyze(set, strict).culprits, std::vector<int>{2});
}

TEST(AnalyzerTest, TimeoutTriggerMeansHungWhateverTheAge) {
  TempDir dir;
  const DumpSet set = live_job(std::chrono::milliseconds(200), DumpTrigger::kTimeout, dir);
  EXPECT_EQ(analyze(set).culprits, std::vector<int>{2});
}

// A launcher asks for dumps the moment a rank dies, often before the others notice: their
// collective is young, but it needs the dead rank, so it is a wait all the same. The same dumps
// with the rank merely missing (no exit recorded) blame nobody.
TEST(AnalyzerTest, YoungOpThatNeedsARankTheLauncherSawDieIsAWait) {
  for (const int signal : {9, 0}) {
    TempDir dir;
    DumpSet set = live_job(std::chrono::milliseconds(5), DumpTrigger::kStoreRequest, dir);
    set.dumps.pop_back();  // rank 2 left no dump
    set.missing_ranks = {2};
    set.exits = {ExitRecord{.rank = 2, .exit_code = signal ? -1 : 0, .signal = signal}};
    Verdict v = analyze(set);
    EXPECT_EQ(v.culprits, std::vector<int>{2}) << format_verdict(v);
    EXPECT_EQ(v.positions[0].where, RankPosition::Where::kInOperation) << format_verdict(v);
    set.exits.clear();
    v = analyze(set);
    EXPECT_TRUE(v.culprits.empty()) << format_verdict(v);
  }
}

TEST(AnalyzerTest, MismatchWithoutMajorityIsInconclusive) {
  TempDir dir;
  for (int r = 0; r < 4; ++r) {
    FlightRecorder fr(RecorderOptions{8});
    fr.set_process_info(r, 4);
    fr.register_group(1, "world", {0, 1, 2, 3});
    RecordArgs a;
    a.group_id = 1;
    a.seq = 1;
    a.input = TensorMeta::make("f32", {r < 2 ? 8 : 16});
    fr.completed(fr.record(a));
    write_dump(fr, {}, dir.path());
  }
  const Verdict v = analyze(read_dump_dir(dir.path()));
  EXPECT_EQ(v.status, VerdictStatus::kInconclusive) << format_verdict(v);
  EXPECT_TRUE(v.culprits.empty());
}

TEST(AnalyzerTest, MissingDumpNobodyWaitsOnIsInconclusive) {
  TempDir dir;
  SynthOptions o;
  o.ranks = 4;
  synth_write("healthy", o, dir.path());
  std::filesystem::remove(dir.path() / "tessel_fr_rank2.json");
  const Verdict v = analyze(read_dump_dir(dir.path()));
  EXPECT_EQ(v.status, VerdictStatus::kInconclusive) << format_verdict(v);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.positions[2].where, RankPosition::Where::kNoDump);
}

TEST(AnalyzerTest, FailedCollectivesAreNotedOncePerCall) {
  TempDir dir;
  for (int r = 0; r < 3; ++r) {
    FlightRecorder fr(RecorderOptions{8});
    fr.set_process_info(r, 3);
    fr.register_group(1, "world", {0, 1, 2});
    RecordArgs a;
    a.group_id = 1;
    a.seq = 1;
    a.input = TensorMeta::make("f32", {8});
    fr.failed(fr.record(a));
    write_dump(fr, {DumpTrigger::kError, r, "gloo error"}, dir.path());
  }
  const Verdict v = analyze(read_dump_dir(dir.path()));
  EXPECT_TRUE(v.culprits.empty());
  ASSERT_EQ(v.notes.size(), 1u) << format_verdict(v);
  EXPECT_NE(v.notes[0].find("all_reduce #1 of group 'world' failed on ranks 0-2"),
            std::string::npos)
      << v.notes[0];
}

TEST(AnalyzerTest, CoalescedOpsAlignByIndexWithinTheirSeq) {
  TempDir dir;
  for (int r = 0; r < 3; ++r) {
    FlightRecorder fr(RecorderOptions{8});
    fr.set_process_info(r, 3);
    fr.register_group(1, "world", {0, 1, 2});
    for (uint32_t i = 0; i < 2; ++i) {  // one batch, two ops of different sizes, one seq
      RecordArgs a;
      a.group_id = 1;
      a.seq = 1;
      a.coalesced_id = 1;
      a.coalesced_index = i;
      a.input = TensorMeta::make("f32", {i == 0 ? 8 : 16});
      fr.completed(fr.record(a));
    }
    write_dump(fr, {}, dir.path());
  }
  const Verdict v = analyze(read_dump_dir(dir.path()));
  EXPECT_EQ(v.status, VerdictStatus::kHealthy) << format_verdict(v);
}

// The numbers a verdict quotes belong to the right ranks: the collective is described by the
// majority's arguments, the culprit's own ones are in its detail (rank 0 is the first member, so
// describing "the first entry" would have quoted the culprit's).
TEST(AnalyzerTest, MismatchQuotesTheMajoritysArgumentsAndTheCulpritsOwn) {
  SynthOptions o;
  o.ranks = 4;
  o.culprit = 0;
  const Verdict v = run_scenario("size_mismatch", o);
  const std::string text = format_verdict(v);
  EXPECT_NE(text.find("argument mismatch in all_reduce #7 of group 'world' (step 6, f32[1024], "
                      "sum): rank 0 disagrees with the other 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 0 passed 2048 input / 2048 output elements where the others passed "
                      "1024 / 1024"),
            std::string::npos)
      << text;
}

TEST(AnalyzerTest, SendWithoutRecvIsDescribedFromTheSender) {
  SynthOptions o;
  o.ranks = 4;
  o.culprit = 1;
  o.partner = 3;
  const Verdict v = run_scenario("send_without_recv", o);
  const std::string text = format_verdict(v);
  EXPECT_NE(text.find("[unmatched_send] send #1 from rank 3 to rank 1 in group 'world' has no "
                      "matching recv: rank 1 never posted it"),
            std::string::npos)
      << text;
}

// An all_reduce of `numel` f32 elements, collective `seq` of `group`.
RecordArgs all_reduce_args(uint64_t group, uint64_t seq, int64_t numel = 8) {
  RecordArgs a;
  a.group_id = group;
  a.seq = seq;
  a.input = TensorMeta::make("f32", {numel});
  return a;
}

// A deadlock the order votes settle with entries far behind the end of the voters' rings: ranks
// 0 and 1 wait in 'a' #1 and 'b' #1 (each never issued the other's), and ranks 2 and 3, in the
// sibling groups, took 'a' #1 before 'b' #1 and then 100 more 'a' collectives. Three votes for
// 'a' first against rank 1's one: rank 1 deviated. The streaming reader holds only a window of
// the newest entries per group, so it reads rank 2's and 3's 'a' #1 again from their dumps.
TEST(AnalyzerTest, DeadlockOrderVotesReachPastTheHeldWindow) {
  TempDir dir;
  RecorderOptions ro;
  ro.capacity = 256;
  ro.clock = fake_clock;
  ro.wall_clock = fake_wall;
  for (int r = 0; r < 4; ++r) {
    FlightRecorder fr(ro);
    fr.set_process_info(r, 4);
    fr.register_group(1, "a", {0, 1});
    fr.register_group(2, "a", {2, 3});
    fr.register_group(3, "b", {0, 1});
    fr.register_group(4, "b", {2, 3});
    auto issue = [&](uint64_t group, uint64_t seq) {
      return fr.record(all_reduce_args(group, seq));
    };
    if (r == 0) fr.started(issue(1, 1));
    if (r == 1) fr.started(issue(3, 1));
    if (r >= 2) {
      fr.completed(issue(2, 1));
      fr.completed(issue(4, 1));
      for (uint64_t seq = 2; seq <= 101; ++seq) fr.completed(issue(2, seq));
    }
    write_dump(fr, {r == 0 ? DumpTrigger::kTimeout : DumpTrigger::kStoreRequest, 0, ""},
               dir.path());
  }
  static_assert(internal::kHeldPerGroup < 100, "'a' #1 must fall outside the held window");
  const Verdict whole = analyze(read_dump_dir(dir.path()));
  const Verdict streamed = analyze_dump_dir(dir.path()).verdict;
  for (const Verdict* v : {&whole, &streamed}) {
    EXPECT_EQ(v->status, VerdictStatus::kCulpritFound) << format_verdict(*v);
    EXPECT_EQ(v->culprits, std::vector<int>{1});
    ASSERT_EQ(v->findings.size(), 1u);
    EXPECT_EQ(v->findings[0].kind, FindingKind::kDeadlock);
  }
  EXPECT_NE(format_verdict(streamed).find("an order 1 rank used, against 3"), std::string::npos)
      << format_verdict(streamed);
}

// A mismatch that did not hang the job (rank 2's all_reduce #10 had twice the elements, and
// every collective completed) is still found 290 collectives later, far behind the window of
// entries the streaming reader holds: the alignment records cover the whole ring.
TEST(AnalyzerTest, MismatchFarBehindTheHeldWindowIsFound) {
  TempDir dir;
  for (int r = 0; r < 3; ++r) {
    FlightRecorder fr(RecorderOptions{1024});
    fr.set_process_info(r, 3);
    fr.register_group(1, "world", {0, 1, 2});
    for (uint64_t seq = 1; seq <= 300; ++seq) {
      fr.completed(fr.record(all_reduce_args(1, seq, r == 2 && seq == 10 ? 16 : 8)));
    }
    write_dump(fr, {}, dir.path());
  }
  static_assert(internal::kHeldPerGroup < 290, "#10 must fall outside the held window");
  const Verdict whole = analyze(read_dump_dir(dir.path()));
  const Verdict streamed = analyze_dump_dir(dir.path()).verdict;
  EXPECT_EQ(verdict_to_json(streamed), verdict_to_json(whole));
  EXPECT_EQ(streamed.culprits, std::vector<int>{2}) << format_verdict(streamed);
  ASSERT_EQ(streamed.findings.size(), 1u);
  EXPECT_EQ(streamed.findings[0].kind, FindingKind::kMismatch);
  EXPECT_EQ(streamed.findings[0].seq, 10u);
  EXPECT_EQ(streamed.findings[0].waiting, (std::vector<int>{0, 1}));
}

TEST(AnalyzerTest, FormatsRankLists) {
  EXPECT_EQ(format_rank_list({}), "");
  EXPECT_EQ(format_rank_list({4}), "4");
  EXPECT_EQ(format_rank_list({0, 1, 2, 4, 6, 7, 9}), "0-2,4,6,7,9");
}

// 1,024 ranks: the analyzer still names the one rank (speed is measured in bench/).
TEST(AnalyzerScaleTest, FindsTheCulpritAmong1024Ranks) {
  SynthOptions o;
  o.ranks = 1024;
  o.culprit = 777;
  o.steps = 6;
  const Verdict v = run_scenario("skip_collective", o);
  EXPECT_EQ(v.status, VerdictStatus::kCulpritFound);
  EXPECT_EQ(v.culprits, std::vector<int>{777});
  EXPECT_EQ(v.dumps, 1024);
}

}  // namespace
}  // namespace tessel::fr
