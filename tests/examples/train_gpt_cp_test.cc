// train_gpt --cp as a user runs it: 20 steps of a tiny GPT on 4 Gloo processes under tessel-run
// at --cp 2 --dp-shard 2 and at --cp 4 (every sequence split over the ranks, ring attention,
// FSDP over dp_shard x cp) print the losses of one process within f32 relative 1e-5; flags that
// do not go with --cp fail naming them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/examples/train_gpt_run.h"

namespace {

using namespace train_gpt_test;

class TrainGptCpTest : public TrainGptRunTest {
 protected:
  TrainGptCpTest() : TrainGptRunTest("train_gpt_cp") {}

  std::vector<std::string> training(const std::string& log,
                                    const std::vector<std::string>& more = {}) const {
    return tiny_training(20, 2, log, more);
  }
};

TEST_F(TrainGptCpTest, ContextParallelRunsMatchOneProcess) {
  Result one = run(TRAIN_GPT_PATH, training("one.jsonl"));
  ASSERT_EQ(one.status, 0) << one.err;
  Result cp2 = run(on_four_ranks(), training("cp2.jsonl", {"--cp", "2", "--dp-shard", "2"}));
  ASSERT_EQ(cp2.status, 0) << cp2.out << cp2.err;
  EXPECT_NE(cp2.out.find("FSDP x context parallel (cp 2) over 4 ranks"), std::string::npos)
      << cp2.out;
  Result cp4 = run(on_four_ranks(), training("cp4.jsonl", {"--cp", "4"}));
  ASSERT_EQ(cp4.status, 0) << cp4.out << cp4.err;
  // The Llama (rotary positions at each rank's global positions) at --cp 2 --dp-shard 2.
  Result llama_one = run(TRAIN_GPT_PATH, training("llama_one.jsonl", {"--model", "llama"}));
  ASSERT_EQ(llama_one.status, 0) << llama_one.err;
  Result llama_cp2 =
      run(on_four_ranks(),
          training("llama_cp2.jsonl", {"--model", "llama", "--cp", "2", "--dp-shard", "2"}));
  ASSERT_EQ(llama_cp2.status, 0) << llama_cp2.out << llama_cp2.err;
  const auto want = losses("one.jsonl");
  ASSERT_EQ(want.size(), 20u);
  const auto llama_want = losses("llama_one.jsonl"), llama_got = losses("llama_cp2.jsonl");
  ASSERT_EQ(llama_got.size(), 20u);
  for (const auto& [step, loss] : llama_want) {
    EXPECT_NEAR(llama_got.at(step), loss, 1e-5 * loss) << "llama step " << step;
  }
  for (const std::string log : {"cp2.jsonl", "cp4.jsonl"}) {
    const auto got = losses(log);
    ASSERT_EQ(got.size(), 20u) << log;
    for (const auto& [step, loss] : want) {
      EXPECT_NEAR(got.at(step), loss, 1e-5 * loss) << log << " step " << step;
    }
  }
}

TEST_F(TrainGptCpTest, FlagsThatDoNotGoWithCpAreNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--cp", "2", "--model", "llama-moe"}, "it needs --model gpt or llama"},
      {{"--cp", "2", "--ddp"}, "drop --ddp"},
      {{"--cp", "3"}, "make --seq 32 a multiple of 6"},
  };
  for (const auto& [flags, message] : cases) {
    Result r = run(TRAIN_GPT_PATH, training("bad.jsonl", flags));
    EXPECT_NE(r.status, 0) << fmt::format("{}", fmt::join(flags, " "));
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
}

}  // namespace
