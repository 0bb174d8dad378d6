// train_gpt on token shards (--data GLOB) and with gradient accumulation, run as a user runs it:
// --grad-accum 4 prints the losses of one step on the whole batch; a run on 2 ranks (tessel-run)
// checkpointed at step 3 and resumed on 1 process continues the token stream of an
// uninterrupted run, loss for loss; shards that match nothing or are truncated fail naming the
// pattern or the file. The shards hold the bundled corpus's bytes (a fixed, tiny input).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/data/token_shard.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TrainGptDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("train_gpt_data_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // The corpus's bytes as tokens: the first 90 % in two training shards, the rest validation.
    const std::string text = slurp(CORPUS_PATH);
    std::vector<uint32_t> tokens(text.begin(), text.end());
    for (auto& t : tokens) t &= 0xff;
    const size_t split = tokens.size() * 9 / 10;
    const std::span<const uint32_t> all(tokens);
    const tessel::data::ShardWriteOptions bytes{.token_bytes = 2, .vocab_size = 256};
    tessel::data::write_token_shard(dir_ / "train_000000.bin", all.first(split / 2), bytes);
    tessel::data::write_token_shard(dir_ / "train_000001.bin",
                                    all.subspan(split / 2, split - split / 2), bytes);
    tessel::data::write_token_shard(dir_ / "val_000000.bin", all.subspan(split), bytes);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `program args` in the scratch folder without a launcher's environment; bounded by ctest's
  // timeout.
  Result run(const std::string& program, const std::vector<std::string>& args) {
    std::string command =
        fmt::format("cd '{}' && env -u RANK -u WORLD_SIZE {}", dir_.string(), program);
    for (const std::string& a : args) command += " '" + a + "'";
    command += " >out.txt 2>err.txt";
    const int raw = std::system(command.c_str());
    Result r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = slurp(dir_ / "out.txt");
    r.err = slurp(dir_ / "err.txt");
    return r;
  }

  // The training arguments of every run here: a small model, 6 steps, on the shards.
  std::vector<std::string> training(std::vector<std::string> more) const {
    std::vector<std::string> args = {"--data",       (dir_ / "train_*.bin").string(),
                                     "--val-data",   (dir_ / "val_*.bin").string(),
                                     "--threads",    "1",
                                     "--steps",      "6",
                                     "--batch",      "8",
                                     "--seq",        "32",
                                     "--layers",     "2",
                                     "--embd",       "32",
                                     "--heads",      "2",
                                     "--sample",     "0",
                                     "--log-every",  "3",
                                     "--checkpoint", (dir_ / "final.safetensors").string()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  // step -> loss of a --log-json file.
  std::map<int, double> losses(const std::string& name) const {
    std::map<int, double> out;
    std::ifstream in(dir_ / name);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) out[j["step"].get<int>()] = j["loss"].get<double>();
    }
    return out;
  }

  fs::path dir_;
};

TEST_F(TrainGptDataTest, GradAccumPrintsTheLossesOfTheWholeBatch) {
  Result whole = run(TRAIN_GPT_PATH, training({"--log-json", "whole.jsonl"}));
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_NE(whole.out.find("token shards"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find("vocabulary 256"), std::string::npos) << whole.out;
  Result accumulated =
      run(TRAIN_GPT_PATH, training({"--grad-accum", "4", "--log-json", "accumulated.jsonl"}));
  ASSERT_EQ(accumulated.status, 0) << accumulated.err;
  const auto want = losses("whole.jsonl");
  const auto got = losses("accumulated.jsonl");
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), 6u);
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got.at(step), loss, 1e-5 * loss) << "step " << step;  // f32 sums reordered
  }
}

TEST_F(TrainGptDataTest, ResumedOnAnotherWorldSizeContinuesTheStream) {
  Result one = run(TRAIN_GPT_PATH, training({"--log-json", "one.jsonl"}));
  ASSERT_EQ(one.status, 0) << one.err;
  // 2 ranks (FSDP), a checkpoint at steps 3 and 6; the one at 6 is dropped, as if killed.
  Result two =
      run(fmt::format("'{}' --standalone --nproc-per-node 2 '{}'", TESSEL_RUN_PATH, TRAIN_GPT_PATH),
          training({"--checkpoint-dir", "ckpt", "--checkpoint-every", "3"}));
  ASSERT_EQ(two.status, 0) << two.out << two.err;
  fs::remove_all(dir_ / "ckpt" / "step_00000006");
  Result resumed =
      run(TRAIN_GPT_PATH,
          training({"--checkpoint-dir", "ckpt", "--resume", "--log-json", "resumed.jsonl"}));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("at step 3"), std::string::npos) << resumed.out;
  const auto want = losses("one.jsonl");
  const auto got = losses("resumed.jsonl");
  ASSERT_EQ(got.size(), 3u);
  for (int step = 4; step <= 6; ++step) {
    EXPECT_NEAR(got.at(step), want.at(step), 1e-5 * want.at(step)) << "step " << step;
  }
}

TEST_F(TrainGptDataTest, BadShardsAreNamed) {
  Result none = run(TRAIN_GPT_PATH, {"--data", (dir_ / "nothing_*.bin").string()});
  EXPECT_EQ(none.status, 65);
  EXPECT_NE(none.err.find("nothing_*.bin"), std::string::npos) << none.err;
  fs::resize_file(dir_ / "train_000001.bin", fs::file_size(dir_ / "train_000001.bin") - 3);
  Result truncated = run(TRAIN_GPT_PATH, training({}));
  EXPECT_NE(truncated.status, 0);
  EXPECT_NE(truncated.err.find("train_000001.bin"), std::string::npos) << truncated.err;
  EXPECT_NE(truncated.err.find("offset"), std::string::npos) << truncated.err;
}

}  // namespace
