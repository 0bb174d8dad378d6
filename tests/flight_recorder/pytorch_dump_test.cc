// PyTorch's flight-recorder dumps of real hung jobs (Gloo, 4 ranks; made by
// scripts/pytorch_fr_fixtures.sh, committed under pytorch/fixtures) read in both of PyTorch's
// formats and judged by the same analyzer; the pickle reader's refusals.
#include "tessel/flight_recorder/pytorch_dump.h"

#include <gtest/gtest.h>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/internal/pickle.h"

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
    {"skip", VerdictStatus::kCulpritFound, {1}, {},
     "rank 1 did not join all_reduce #4 of group 'default_pg' (no step, f32[4]); ranks 0,2,3 "
     "wait in it"},
    {"size_mismatch", VerdictStatus::kCulpritFound, {2}, {},
     "rank 2 passed 8 input / 8 output elements where the others passed 4 / 4"},
    {"deadlock", VerdictStatus::kInconclusive, {}, {0, 1},
     "ranks 0,1 each wait for the other"},
    {"killed", VerdictStatus::kCulpritFound, {3}, {}, "rank 3: no dump"},
    {"unmatched_send", VerdictStatus::kHealthy, {}, {}, "verdict: HEALTHY"},
};

class PytorchDumpTest : public ::testing::TestWithParam<std::tuple<Case, std::string>> {};

TEST_P(PytorchDumpTest, FixtureGivesTheVerdictOfItsFault) {
  const auto& [c, format] = GetParam();
  const DumpSet set = read_dump_dir(
      std::string(PYTORCH_FIXTURES) + "/" + c.scenario + "/" + format, /*world_size_hint=*/4);
  EXPECT_TRUE(set.problems.empty()) << set.problems.front().message;
  EXPECT_EQ(set.world_size, 4);
  const Verdict v = analyze(set);
  const std::string text = format_verdict(v);
  EXPECT_EQ(v.status, c.status) << text;
  EXPECT_EQ(v.culprits, c.culprits) << text;
  EXPECT_EQ(v.suspects, c.suspects) << text;
  EXPECT_NE(text.find(c.words), std::string::npos) << c.words << "\n" << text;
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, PytorchDumpTest,
    ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("json", "pickle")),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).scenario) + "_" + std::get<1>(info.param);
    });

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
  const std::string ok("\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x4a\xfe\xff\xff\xff\x58\x01\x00\x00\x00\x78\x71\x03\x4e\x88\x65\x58\x01\x00\x00\x00\x62\x71\x04\x4b\x03\x85\x71\x05\x75\x2e", 51);
  const auto j = internal::unpickle(ok, "dump_0");
  EXPECT_EQ(j.dump(), R"({"a":[1,-2,"x",null,true],"b":[3]})");
  // GLOBAL (builds a Python object): never.
  expect_refused(std::string("\x80\x02" "cos\nsystem\n", 13), "opcode 0x63 is not supported");
  expect_refused(std::string("\x80\x02}q\x00(X\x09\x00\x00\x00ab", 12), "truncated");
  expect_refused(std::string("\x80\x02K\x01K\x02.", 7), "STOP with 2 values");
}

}  // namespace
}  // namespace tessel::fr
