// train_gpt --model llama-moe as a user runs it: 20 steps of a tiny MoE Llama on 4 Gloo
// processes under tessel-run with --ep 2 (experts over 2 ranks, FSDP over the other 2) print the
// losses of one process within f32 relative 1e-5 and the same per-expert counts every step
// (--log-json's moe_counts, with moe_imbalance = max / mean), as does --ep 1 (plain FSDP, the
// counts summed over the ranks); a run checkpointed at --ep 4
// resumes at --ep 2 with the one-process losses; experts that do not divide over --ep and --ep
// without an MoE model fail naming the flags.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tests/examples/train_gpt_run.h"

namespace {

using namespace train_gpt_test;

constexpr double kLossRtol = 1e-5;

struct Step {
  double loss = 0;
  std::vector<std::vector<int64_t>> counts;
  std::vector<double> imbalance;
};

class TrainGptMoeTest : public TrainGptRunTest {
 protected:
  TrainGptMoeTest() : TrainGptRunTest("train_gpt_moe") {}

  // A tiny MoE Llama (8 experts, top-2) on the bundled corpus, logged to `log`.
  std::vector<std::string> training(int steps, const std::string& log,
                                    const std::vector<std::string>& more = {}) const {
    std::vector<std::string> args = {"--model", "llama-moe"};
    const std::vector<std::string> tiny = tiny_training(steps, 2, log, more);
    args.insert(args.end(), tiny.begin(), tiny.end());
    return args;
  }

  std::map<int, Step> steps(const std::string& name) const {
    std::map<int, Step> out;
    std::ifstream in(dir_ / name);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("loss")) continue;
      Step s;
      s.loss = j["loss"].get<double>();
      s.counts = j["moe_counts"].get<std::vector<std::vector<int64_t>>>();
      s.imbalance = j["moe_imbalance"].get<std::vector<double>>();
      out[j["step"].get<int>()] = s;
    }
    return out;
  }

  void expect_same_run(const std::string& got_log, const std::string& want_log, int first,
                       int last) {
    const auto want = steps(want_log);
    const auto got = steps(got_log);
    for (int step = first; step <= last; ++step) {
      ASSERT_TRUE(want.count(step) && got.count(step)) << got_log << " step " << step;
      EXPECT_NEAR(got.at(step).loss, want.at(step).loss, kLossRtol * want.at(step).loss)
          << got_log << " step " << step;
      EXPECT_EQ(got.at(step).counts, want.at(step).counts) << got_log << " step " << step;
    }
  }
};

TEST_F(TrainGptMoeTest, ExpertParallelOnFourRanksMatchesOneProcess) {
  Result one = run(TRAIN_GPT_PATH, training(20, "one.jsonl"));
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("(MoE from layer 1: 8 experts of hidden 32, top-2)"), std::string::npos)
      << one.out;
  EXPECT_NE(one.out.find("experts max/mean"), std::string::npos) << one.out;
  const auto learned = steps("one.jsonl");
  ASSERT_LT(learned.at(20).loss, learned.at(1).loss - 0.5) << "the run learned nothing";
  for (const auto& [step, s] : learned) {
    ASSERT_EQ(s.counts.size(), 1u);  // one MoE layer
    const auto& c = s.counts[0];
    const int64_t total = std::accumulate(c.begin(), c.end(), int64_t{0});
    EXPECT_EQ(total, 8 * 32 * 2) << "every token's two choices, step " << step;
    EXPECT_NEAR(s.imbalance[0], *std::max_element(c.begin(), c.end()) * 8.0 / total, 1e-4);
  }

  // --ep 1: plain FSDP, the counts still summed over the ranks.
  Result dp = run(on_four_ranks(), training(20, "ep1.jsonl", {"--ep", "1"}));
  ASSERT_EQ(dp.status, 0) << dp.out << dp.err;
  expect_same_run("ep1.jsonl", "one.jsonl", 1, 20);

  Result ep = run(on_four_ranks(), training(20, "ep2.jsonl", {"--ep", "2"}));
  ASSERT_EQ(ep.status, 0) << ep.out << ep.err;
  EXPECT_NE(ep.out.find("expert parallel: ep 2 x efsdp 2, 4 experts per rank"), std::string::npos)
      << ep.out;
  expect_same_run("ep2.jsonl", "one.jsonl", 1, 20);
}

TEST_F(TrainGptMoeTest, CheckpointAtEp4ResumesAtEp2) {
  // A constant learning rate, so that a 10-step run is the first half of a 20-step one.
  const std::vector<std::string> flat = {"--warmup", "0", "--lr", "3e-3", "--min-lr", "3e-3"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), flat.begin(), flat.end());
    return more;
  };
  Result one = run(TRAIN_GPT_PATH, training(20, "one.jsonl", flat));
  ASSERT_EQ(one.status, 0) << one.err;
  const std::string ckpt = (dir_ / "ckpt").string();
  Result first =
      run(on_four_ranks(),
          training(10, "resumed.jsonl",
                   with({"--ep", "4", "--checkpoint-dir", ckpt, "--checkpoint-every", "10"})));
  ASSERT_EQ(first.status, 0) << first.out << first.err;
  Result second =
      run(on_four_ranks(),
          training(20, "resumed.jsonl", with({"--ep", "2", "--checkpoint-dir", ckpt, "--resume"})));
  ASSERT_EQ(second.status, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  expect_same_run("resumed.jsonl", "one.jsonl", 11, 20);
}

TEST_F(TrainGptMoeTest, BadExpertFlagsAreNamed) {
  Result r = run(TRAIN_GPT_PATH, training(1, "x.jsonl", {"--ep", "3"}));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--experts 8 do not divide over --ep 3"), std::string::npos) << r.err;
  r = run(TRAIN_GPT_PATH, {"--model", "llama", "--ep", "2"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--ep 2 shards the experts of --model llama-moe"), std::string::npos)
      << r.err;
}

}  // namespace
