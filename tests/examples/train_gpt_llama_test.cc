// train_gpt --model llama as a user runs it: 20 steps of a tiny Llama (4 heads, 2 K/V heads) on
// 4 processes under tessel-run with --dp-shard 2 --tp 2 (with and without --sequence-parallel)
// print the losses of one process within f32 relative 1e-5 (the tp all_reduces and FSDP's
// reduce_scatters reorder sums; measured about 2e-7); a model written by --export-hf starts
// another run through --init-hf, on 4 ranks as on one; K/V heads that do not split over --tp and
// a --model that contradicts the folder fail naming the flags.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/examples/train_gpt_run.h"

namespace {

using namespace train_gpt_test;

constexpr double kLossRtol = 1e-5;

class TrainGptLlamaTest : public TrainGptRunTest {
 protected:
  TrainGptLlamaTest() : TrainGptRunTest("train_gpt_llama") {}

  // A tiny Llama on the bundled corpus, `steps` steps, logged to `log`.
  std::vector<std::string> training(int steps, const std::string& log,
                                    const std::vector<std::string>& more = {}) const {
    return tiny_training(steps, 2, log, more);
  }

  void expect_same_losses(const std::string& got_log, const std::string& want_log, size_t steps) {
    const auto want = losses(want_log);
    const auto got = losses(got_log);
    ASSERT_EQ(want.size(), steps);
    ASSERT_EQ(got.size(), steps);
    for (const auto& [step, loss] : want) {
      EXPECT_NEAR(got.at(step), loss, kLossRtol * loss) << got_log << " step " << step;
    }
  }
};

TEST_F(TrainGptLlamaTest, FsdpTimesTpOnFourRanksMatchesOneProcess) {
  const std::vector<std::string> llama = {"--model", "llama", "--kv-heads", "2"};
  Result one = run(TRAIN_GPT_PATH, training(20, "one.jsonl", llama));
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("model: llama, 2 layers, 4 heads (2 K/V)"), std::string::npos) << one.out;
  const auto learned = losses("one.jsonl");
  ASSERT_LT(learned.at(20), learned.at(1) - 0.5) << "the run learned nothing to compare";

  std::vector<std::string> mesh = llama;
  mesh.insert(mesh.end(), {"--dp-shard", "2", "--tp", "2"});
  Result four = run(on_four_ranks(), training(20, "four.jsonl", mesh));
  ASSERT_EQ(four.status, 0) << four.out << four.err;
  EXPECT_NE(four.out.find("FSDP x tensor parallel over 4 ranks"), std::string::npos) << four.out;
  expect_same_losses("four.jsonl", "one.jsonl", 20);

  mesh.push_back("--sequence-parallel");
  Result sp = run(on_four_ranks(), training(20, "sp.jsonl", mesh));
  ASSERT_EQ(sp.status, 0) << sp.out << sp.err;
  expect_same_losses("sp.jsonl", "one.jsonl", 20);
}

TEST_F(TrainGptLlamaTest, ExportedModelStartsAnotherRunOnOneOrFourRanks) {
  const std::string hf = (dir_ / "hf").string();
  Result trained = run(
      TRAIN_GPT_PATH,
      training(20, "trained.jsonl", {"--model", "llama", "--kv-heads", "2", "--export-hf", hf}));
  ASSERT_EQ(trained.status, 0) << trained.err;
  EXPECT_NE(slurp(fs::path(hf) / "config.json").find("LlamaForCausalLM"), std::string::npos);
  ASSERT_TRUE(fs::exists(fs::path(hf) / "model.safetensors"));

  Result one = run(TRAIN_GPT_PATH, training(3, "one.jsonl", {"--init-hf", hf}));
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("initialised from Hugging Face folder"), std::string::npos) << one.out;
  // It starts where the exported model ended, not from a random model's loss.
  EXPECT_LT(losses("one.jsonl").at(1), losses("trained.jsonl").at(1) - 0.5);
  Result four = run(on_four_ranks(),
                    training(3, "four.jsonl", {"--init-hf", hf, "--dp-shard", "2", "--tp", "2"}));
  ASSERT_EQ(four.status, 0) << four.out << four.err;
  expect_same_losses("four.jsonl", "one.jsonl", 3);
}

TEST_F(TrainGptLlamaTest, BadLlamaFlagsFailNamingThem) {
  Result kv = run(TRAIN_GPT_PATH,
                  training(1, "kv.jsonl", {"--model", "llama", "--kv-heads", "2", "--tp", "4"}));
  EXPECT_EQ(kv.status, 65);
  EXPECT_NE(kv.err.find("--kv-heads 2 does not split over --tp 4"), std::string::npos) << kv.err;
  Result gpt_kv = run(TRAIN_GPT_PATH, training(1, "gpt.jsonl", {"--kv-heads", "2"}));
  EXPECT_EQ(gpt_kv.status, 65);
  EXPECT_NE(gpt_kv.err.find("--kv-heads 2 is for --model llama"), std::string::npos) << gpt_kv.err;
  Result no_folder = run(TRAIN_GPT_PATH, training(1, "hf.jsonl", {"--init-hf", "nowhere"}));
  EXPECT_EQ(no_folder.status, 65);
  EXPECT_NE(no_folder.err.find("--init-hf 'nowhere': no config.json"), std::string::npos)
      << no_folder.err;
}

}  // namespace
