// PyTorch's flight-recorder dumps of real hung jobs (Gloo, 4 ranks; made by
// scripts/pytorch_fr_fixtures.sh, committed under pytorch/fixtures) read in both of PyTorch's
// formats and judged by the same analyzer; dumps written after a timeout (timeout_*, written in
// the recorder's format by pytorch/write_timeout_fixtures.py); the pickle reader's refusals.
#include "tessel/flight_recorder/pytorch_dump.h"

#include <gtest/gtest.h>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/internal/pickle.h"
#include "tessel/flight_recorder/internal/pytorch_timeouts.h"

namespace tessel::fr {
namespace {

struct Case {
  const char* scenario;
  VerdictStatus status;
  std::vector<int> culprits;
  std::vector<int> suspects;
  const char* words;
};

// What each injected fault must give. send/recv are not recorded by PyTorch's Gloo backend, so
// the unmatched send leaves no trace: healthy, as far as the dumps can tell.
const Case kCases[] = {
    {"healthy", VerdictStatus::kHealthy, {}, {}, "verdict: HEALTHY"},
    {"skip",
     VerdictStatus::kCulpritFound,
     {1},
     {},
     "rank 1 did not join all_reduce #4 of group 'default_pg' (no step, f32[4]); ranks 0,2,3 "
     "wait in it"},
    {"size_mismatch",
     VerdictStatus::kCulpritFound,
     {2},
     {},
     "rank 2 passed 8 input / 8 output elements where the others passed 4 / 4"},
    {"deadlock", VerdictStatus::kInconclusive, {}, {0, 1}, "ranks 0,1 each wait for the other"},
    {"killed", VerdictStatus::kCulpritFound, {3}, {}, "rank 3: no dump"},
    {"unmatched_send", VerdictStatus::kHealthy, {}, {}, "verdict: HEALTHY"},
};

class PytorchDumpTest : public ::testing::TestWithParam<std::tuple<Case, std::string>> {};

TEST_P(PytorchDumpTest, FixtureGivesTheVerdictOfItsFault) {
  const auto& [c, format] = GetParam();
  const DumpSet set = read_dump_dir(std::string(PYTORCH_FIXTURES) + "/" + c.scenario + "/" + format,
                                    /*world_size_hint=*/4);
  EXPECT_TRUE(set.problems.empty()) << set.problems.front().message;
  EXPECT_EQ(set.world_size, 4);
  const Verdict v = analyze(set);
  const std::string text = format_verdict(v);
  EXPECT_EQ(v.status, c.status) << text;
  EXPECT_EQ(v.culprits, c.culprits) << text;
  EXPECT_EQ(v.suspects, c.suspects) << text;
  EXPECT_NE(text.find(c.words), std::string::npos) << c.words << "\n" << text;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PytorchDumpTest,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values("json", "pickle")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).scenario) + "_" +
                                  std::get<1>(info.param);
                         });

// Dumps written after a collective timed out (write_timeout_fixtures.py, in the recorder's
// format): PyTorch retires the timed-out entry as it retires a finished one, so without the
// reconciliation every one of these but the healthy ones read HEALTHY.
struct TimeoutCase {
  const char* scenario;
  int world;
  VerdictStatus status;
  std::vector<int> culprits;
  std::vector<int> suspects;
  const char* words;
};

const TimeoutCase kTimeoutCases[] = {
    // Two ranks: as many issued #4 as did not, so the analyzer blames neither (as it does when
    // no timeout fired); what it must not say is HEALTHY.
    {"timeout_w2_r1",
     2,
     VerdictStatus::kInconclusive,
     {},
     {0, 1},
     "rank 0 waits in all_reduce #4 of group 'default_pg' (no step, f32[4]) while rank 1 never "
     "issued it"},
    {"timeout_w3_r0",
     3,
     VerdictStatus::kCulpritFound,
     {0},
     {},
     "rank 0 did not join all_reduce #4 of group 'default_pg' (no step, f32[4]); ranks 1,2 "
     "wait in it"},
    {"timeout_w4_r3",
     4,
     VerdictStatus::kCulpritFound,
     {3},
     {},
     "rank 3 did not join all_reduce #4 of group 'default_pg' (no step, f32[4]); ranks 0-2 "
     "wait in it"},
    {"timeout_w8_r5",
     8,
     VerdictStatus::kCulpritFound,
     {5},
     {},
     "rank 5 did not join all_reduce #4 of group 'default_pg' (no step, f32[4]); ranks "
     "0-4,6,7 wait in it"},
    {"timeout_stamped",
     4,
     VerdictStatus::kCulpritFound,
     {2},
     {},
     "rank 2 did not join all_reduce #4 of group 'default_pg'"},
    {"timeout_mesh",
     4,
     VerdictStatus::kCulpritFound,
     {3},
     {},
     "rank 3 did not join all_reduce #3 of group 'mesh_tp'"},
    {"timeout_continued",
     4,
     VerdictStatus::kCulpritFound,
     {1},
     {},
     "rank 1 did not join all_reduce #3 of group 'default_pg'"},
    {"timeout_p2p",
     3,
     VerdictStatus::kCulpritFound,
     {1},
     {},
     "[unmatched_send] send #2 from rank 0 to rank 1 in group 'default_pg' has no matching recv: "
     "rank 1 never posted it"},
    {"timeout_healthy", 8, VerdictStatus::kHealthy, {}, {}, "verdict: HEALTHY"},
    {"timeout_healthy_mesh", 4, VerdictStatus::kHealthy, {}, {}, "verdict: HEALTHY"},
    {"timeout_p2p_healthy", 2, VerdictStatus::kHealthy, {}, {}, "verdict: HEALTHY"},
};

class PytorchTimeoutTest : public ::testing::TestWithParam<std::tuple<TimeoutCase, std::string>> {};

TEST_P(PytorchTimeoutTest, RankThatNeverEnteredIsTheOnlyCulprit) {
  const auto& [c, format] = GetParam();
  const DumpSet set =
      read_dump_dir(std::string(PYTORCH_FIXTURES) + "/" + c.scenario + "/" + format);
  ASSERT_TRUE(set.problems.empty()) << set.problems.front().message;
  EXPECT_EQ(set.world_size, c.world);
  const Verdict v = analyze(set);
  const std::string text = format_verdict(v);
  EXPECT_EQ(v.status, c.status) << text;
  EXPECT_EQ(v.culprits, c.culprits) << text;
  EXPECT_EQ(v.suspects, c.suspects) << text;
  EXPECT_NE(text.find(c.words), std::string::npos) << c.words << "\n" << text;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PytorchTimeoutTest,
                         ::testing::Combine(::testing::ValuesIn(kTimeoutCases),
                                            ::testing::Values("json", "pickle")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).scenario) + "_" +
                                  std::get<1>(info.param);
                         });

TraceEntry collective(uint64_t record_id, uint64_t group, uint64_t seq) {
  TraceEntry e;
  e.record_id = record_id;
  e.group_id = group;
  e.seq = seq;
  e.state = EntryState::kCompleted;
  e.enqueued_ns = 1000 * record_id;
  e.completed_ns = 1000 * record_id + 500;
  return e;
}

// Two ranks of a world group (1) and a pair group (2); rank 0 finished world #1..3.
std::vector<RankDump> two_ranks() {
  std::vector<RankDump> dumps(2);
  for (int r = 0; r < 2; ++r) {
    dumps[r].rank = r;
    dumps[r].world_size = 2;
    dumps[r].groups = {{1, "default_pg", {0, 1}}, {2, "pair", {0, 1}}};
  }
  for (uint64_t s = 1; s <= 3; ++s) dumps[0].entries.push_back(collective(s, 1, s));
  return dumps;
}

TEST(PytorchTimeoutsTest, SeqAMemberNeverIssuedIsReadBackAsWaiting) {
  auto dumps = two_ranks();
  dumps[1].entries = {collective(1, 1, 1), collective(2, 1, 2)};
  EXPECT_EQ(internal::reconcile_pytorch_timeouts(dumps), 1u);
  EXPECT_EQ(dumps[0].entries[1].state, EntryState::kCompleted);
  EXPECT_EQ(dumps[0].entries[2].state, EntryState::kStarted);
  EXPECT_EQ(dumps[0].entries[2].completed_ns, 0);
  EXPECT_EQ(dumps[0].monotonic_ns, dumps[0].entries[2].enqueued_ns);  // "now" without it
}

TEST(PytorchTimeoutsTest, ARingThatOverwroteTheMembersGroupProvesNothing) {
  auto dumps = two_ranks();
  // Records 1..39 overwritten, world ones among them; it waits in pair #7.
  dumps[1].entries = {collective(40, 2, 7)};
  dumps[1].entries[0].state = EntryState::kScheduled;
  EXPECT_EQ(internal::reconcile_pytorch_timeouts(dumps), 0u);
  dumps[1].entries[0].record_id = 1;  // its whole history: it never issued a world op
  EXPECT_EQ(internal::reconcile_pytorch_timeouts(dumps), 3u);
}

TEST(PytorchTimeoutsTest, AMemberWithoutADumpProvesNothing) {
  auto dumps = two_ranks();
  dumps.pop_back();
  EXPECT_EQ(internal::reconcile_pytorch_timeouts(dumps), 0u);
}

TEST(PytorchTimeoutsTest, SendIsReadBackOnlyWhenThePeerPostedFewerReceives) {
  auto dumps = two_ranks();
  dumps[0].entries.clear();
  for (uint64_t k = 1; k <= 2; ++k) {
    TraceEntry send = collective(k, 2, 0);
    send.op = OpType::kSend;
    send.peer = 1;
    send.p2p_seq = k;
    dumps[0].entries.push_back(send);
  }
  TraceEntry recv = collective(1, 2, 0);
  recv.op = OpType::kRecv;
  recv.peer = 0;
  recv.p2p_seq = 1;
  dumps[1].entries = {recv};
  EXPECT_EQ(internal::reconcile_pytorch_timeouts(dumps), 1u);
  EXPECT_EQ(dumps[0].entries[0].state, EntryState::kCompleted);
  EXPECT_EQ(dumps[0].entries[1].state, EntryState::kStarted);
  EXPECT_EQ(dumps[1].entries[0].state, EntryState::kCompleted);
}

TEST(PytorchDumpTest, RankComesFromTheEndOfTheFileName) {
  EXPECT_EQ(rank_from_dump_name("rank_3"), 3);
  EXPECT_EQ(rank_from_dump_name("nccl_trace_rank_12.json"), 12);
  EXPECT_EQ(rank_from_dump_name("notes.txt"), -1);
}

void expect_refused(const std::string& bytes, const std::string& words) {
  try {
    internal::unpickle(bytes, "dump_0");
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find(words), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("dump_0"), std::string::npos) << e.message();
  }
}

TEST(PickleTest, ReadsPlainValuesAndRefusesEverythingElse) {
  // {'a': [1, -2, 'x', None, True], 'b': (3,)} as protocol 2.
  const std::string ok(
      "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x4a\xfe\xff"
      "\xff\xff\x58\x01\x00\x00\x00\x78\x71\x03\x4e\x88\x65\x58\x01\x00\x00\x00\x62\x71\x04\x4b\x03"
      "\x85\x71\x05\x75\x2e",
      51);
  const auto j = internal::unpickle(ok, "dump_0");
  EXPECT_EQ(j.dump(), R"({"a":[1,-2,"x",null,true],"b":[3]})");
  // GLOBAL (builds a Python object): never.
  expect_refused(std::string("\x80\x02"
                             "cos\nsystem\n",
                             13),
                 "opcode 0x63 is not supported");
  expect_refused(std::string("\x80\x02}q\x00(X\x09\x00\x00\x00ab", 12), "truncated");
  expect_refused(std::string("\x80\x02K\x01K\x02.", 7), "STOP with 2 values");
}

}  // namespace
}  // namespace tessel::fr
