// tessel-tokenize run as a user runs it: the shards it writes hold exactly the ids the library
// gives for each file (separator first), whatever the threads, chunk size and shard size; bad
// input ends with status 1 and a line naming it.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessel/data/bpe_tokenizer.h"
#include "tessel/data/token_shard.h"

namespace tessel::data {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = DATA_FIXTURES;

struct ToolRun {
  int status = -1;
  std::string output;
};

ToolRun run(const std::string& args) {
  const std::string cmd = std::string(TESSEL_TOKENIZE_PATH) + " " + args + " 2>&1";
  ToolRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) r.output.append(buf, n);
  const int raw = ::pclose(p);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("tessel_tokenize_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ifstream in(kFixtures + "/samples.json");
    const auto samples = nlohmann::json::parse(in).get<std::vector<std::string>>();
    // Three documents: the samples joined by newlines (large, so it is cut into many chunks),
    // one sample, and an empty file.
    std::string big;
    for (int rep = 0; rep < 40; ++rep) {
      for (const auto& s : samples) big += s + "\n" + "Line " + std::to_string(rep) + "\n";
    }
    docs_ = {big, samples[3], ""};
    for (size_t i = 0; i < docs_.size(); ++i) {
      const fs::path p = dir_ / fmt::format("doc{}.txt", i);
      std::ofstream(p, std::ios::binary) << docs_[i];
      files_ += " " + p.string();
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // All tokens of the shards OUT/shard_*.bin, in name order.
  std::vector<uint32_t> read_shards(const fs::path& out, size_t* count = nullptr) {
    std::vector<fs::path> paths;
    for (const auto& e : fs::directory_iterator(out)) paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());
    std::vector<uint32_t> all;
    for (const auto& p : paths) {
      TokenShard shard(p);
      for (size_t i = 0; i < shard.size(); ++i) all.push_back(shard[i]);
    }
    if (count) *count = paths.size();
    return all;
  }

  fs::path dir_;
  std::vector<std::string> docs_;
  std::string files_;
};

TEST_F(TokenizeCliTest, ShardsHoldTheLibrarysIdsWhateverThreadsAndChunks) {
  const auto tok = BpeTokenizer::from_tiktoken(kFixtures + "/bpe.tiktoken", kCl100kPattern,
                                               {{"<|endoftext|>", 765}, {"<|pad|>", 766}});
  std::vector<uint32_t> expected;
  for (const auto& d : docs_) {
    expected.push_back(765);
    const auto ids = tok.encode(d);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  const std::string common = "--tiktoken " + kFixtures + "/bpe.tiktoken --pattern cl100k " +
                             "--special '<|endoftext|>=765' --special '<|pad|>=766' " +
                             "--doc-separator '<|endoftext|>'";
  for (const auto& [flags, name] : std::vector<std::pair<std::string, std::string>>{
           {"--threads 1 --chunk-bytes 0", "one"},
           {"--threads 3 --chunk-bytes 200 --shard-tokens 1000", "many"},
           {"--threads 2 --chunk-bytes 64 --shard-tokens 777 --format llmc", "llmc"}}) {
    const fs::path out = dir_ / name;
    const ToolRun r = run(common + " " + flags + " --out " + out.string() + files_);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("tessel-tokenize: 3/3 files"), std::string::npos) << r.output;
    size_t shards = 0;
    EXPECT_EQ(read_shards(out, &shards), expected) << flags;
    EXPECT_EQ(shards, name == "one" ? 1
                                    : (expected.size() + (name == "many" ? 999 : 776)) /
                                          (name == "many" ? 1000 : 777))
        << flags;
    if (name == "llmc") {
      EXPECT_EQ(TokenShard(out / "shard_000000.bin").format(), ShardFormat::kLlmc);
    }
  }
}

TEST_F(TokenizeCliTest, HuggingFaceTokenizer) {
  const auto tok = BpeTokenizer::from_hf_json(kFixtures + "/bpe_llama3.tokenizer.json");
  std::vector<uint32_t> expected;
  for (const auto& d : docs_) {
    const auto ids = tok.encode(d);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  const fs::path out = dir_ / "hf";
  const ToolRun r =
      run("--hf-json " + kFixtures + "/bpe_llama3.tokenizer.json --chunk-bytes 100 --out " +
          out.string() + files_);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_shards(out), expected);
}

TEST_F(TokenizeCliTest, BadInputsExitOneNamingThem) {
  const std::string tk = "--tiktoken " + kFixtures + "/bpe.tiktoken ";
  ToolRun r = run(tk + "--out " + (dir_ / "o").string() + " " + (dir_ / "nope.txt").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("nope.txt"), std::string::npos) << r.output;

  r = run(tk + "--doc-separator '<|bos|>' --out " + (dir_ / "o").string() + files_);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--doc-separator <|bos|>: the tokenizer has no such special token"),
            std::string::npos)
      << r.output;

  r = run("--tiktoken " + (dir_ / "missing.tiktoken").string() + " --out x" + files_);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("missing.tiktoken"), std::string::npos) << r.output;

  r = run("--out x" + files_);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("give a tokenizer"), std::string::npos) << r.output;

  r = run(tk + "--threads 0 --out x" + files_);
  EXPECT_EQ(r.status, 65) << r.output;
  r = run(tk + "--token-bytes 3 --out x" + files_);
  EXPECT_EQ(r.status, 65) << r.output;
  EXPECT_NE(r.output.find("expected 0, 2 or 4"), std::string::npos) << r.output;

  // A vocabulary that needs 4-byte tokens cannot be written with 2.
  r = run(tk + "--token-bytes 2 --special '<|big|>=70000' --doc-separator '<|big|>' --out " +
          (dir_ / "big").string() + files_);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("does not fit 2-byte tokens"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessel::data
