// train_gpt as a user runs it from a shell: every flag given a bad value fails at once with one
// line on stderr that names the flag and the value, and the documented exit status (64 usage,
// 65 a value that cannot work); and docs/training.md's flag table lists exactly the flags and
// defaults of train_gpt --help, so the two cannot drift apart.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs train_gpt with `args` (each single-quoted) in a scratch folder, without a launcher's
// environment; the run is bounded by the ctest timeout (a bad flag never starts training).
Result run_train_gpt(const std::vector<std::string>& args) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("train_gpt_cli_{}", ::getpid());
  fs::create_directories(dir);
  std::string command =
      fmt::format("cd '{}' && env -u RANK -u WORLD_SIZE '{}'", dir.string(), TRAIN_GPT_PATH);
  for (const std::string& a : args) command += " '" + a + "'";
  command += " >out.txt 2>err.txt";
  const int raw = std::system(command.c_str());
  Result r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(dir / "out.txt");
  r.err = slurp(dir / "err.txt");
  fs::remove_all(dir);
  return r;
}

struct BadFlag {
  std::vector<std::string> args;
  int status;
  std::string names;  // what the one line must contain (the flag and the value)
};

// At least one bad value for every flag of train_gpt --help.
const std::vector<BadFlag> kBadFlags = {
    {{"--data", "/no/such/corpus.txt"}, 65, "--data '/no/such/corpus.txt'"},
    {{"--checkpoint", "/no/such/dir/model.safetensors"}, 65, "--checkpoint '/no/such/dir"},
    {{"--val-data", "val_*.bin"}, 65, "--val-data 'val_*.bin' goes with token shards"},
    {{"--grad-accum", "0"}, 65, "--grad-accum '0'"},
    {{"--grad-accum", "3"}, 65, "--grad-accum 3: the 16 sequences"},
    {{"--grad-sync", "sometimes"}, 65, "--grad-sync 'sometimes'"},
    {{"--steps", "0"}, 65, "--steps '0': expected an integer of at least 1"},
    {{"--steps", "many"}, 65, "--steps 'many'"},
    {{"--steps", "99999999999999999999999"}, 65, "--steps '99999999999999999999999'"},
    {{"--batch", "-4"}, 65, "--batch '-4'"},
    {{"--seq", "0"}, 65, "--seq '0'"},
    {{"--layers", "0"}, 65, "--layers '0'"},
    {{"--heads", "0"}, 65, "--heads '0'"},
    {{"--embd", "0"}, 65, "--embd '0'"},
    {{"--embd", "97"}, 65, "--embd 97 does not split over --heads 4"},
    {{"--lr", "0"}, 65, "--lr '0': expected a number greater than 0"},
    {{"--lr", "nan"}, 65, "--lr 'nan'"},
    {{"--min-lr", "-1"}, 65, "--min-lr '-1'"},
    {{"--min-lr", "0.1"}, 65, "--min-lr 0.1 is above --lr"},
    {{"--warmup", "-1"}, 65, "--warmup '-1'"},
    {{"--weight-decay", "-0.1"}, 65, "--weight-decay '-0.1'"},
    {{"--clip", "0"}, 65, "--clip '0'"},
    {{"--seed", "-1"}, 65, "--seed '-1'"},
    {{"--log-every", "0"}, 65, "--log-every '0'"},
    {{"--eval-every", "-1"}, 65, "--eval-every '-1'"},
    {{"--sample", "-1"}, 65, "--sample '-1'"},
    {{"--temperature", "-1"}, 65, "--temperature '-1'"},
    {{"--generate"}, 65, "--generate samples from a saved checkpoint"},
    {{"--prompt", ""}, 65, "--prompt ''"},
    {{"--max-new-tokens", "-1"}, 65, "--max-new-tokens '-1'"},
    {{"--top-k", "257"}, 65, "--top-k '257': expected an integer from 0 to 256"},
    {{"--threads", "-2"}, 65, "--threads '-2': expected an integer from 0 to 4096"},
    {{"--dp-shard", "0"}, 65, "--dp-shard 0"},
    {{"--dp-shard", "2"}, 65, "tessel-run --standalone --nproc-per-node 2 train_gpt --dp-shard 2"},
    {{"--dp-replicate", "0"}, 65, "--dp-replicate '0'"},
    {{"--dp-replicate", "2"}, 65, "tessel-run --standalone --nproc-per-node 2"},
    {{"--ddp=maybe"}, 65, "maybe"},
    {{"--tp", "0"}, 65, "--tp '0'"},
    {{"--tp", "2"}, 65, "--tp 2 needs 2 processes"},
    {{"--sequence-parallel"}, 65, "--sequence-parallel"},
    {{"--log-json", "/no/such/dir/steps.jsonl"}, 65, "--log-json '/no/such/dir"},
    {{"--checkpoint-dir", "/dev/null"}, 65, "--checkpoint-dir '/dev/null'"},
    {{"--checkpoint-every", "-1"}, 65, "--checkpoint-every '-1'"},
    {{"--checkpoint-every", "10"}, 65, "--checkpoint-every 10 needs --checkpoint-dir"},
    {{"--keep-checkpoints", "-1"}, 65, "--keep-checkpoints '-1'"},
    {{"--resume"}, 65, "--resume needs --checkpoint-dir"},
    {{"--device", "tpu"}, 65, "--device 'tpu'"},
    {{"--autocast", "fp8"}, 65, "--autocast 'fp8': expected auto, bf16 or off"},
    {{"--no-such-flag"}, 64, "unknown flag '--no-such-flag'"},
    {{"--steps"}, 64, "--steps needs a value"},
    {{"stray"}, 64, "unexpected argument 'stray'"},
};

TEST(TrainGptCliTest, EveryBadFlagGivesOneLineAndTheDocumentedStatus) {
  for (const BadFlag& bad : kBadFlags) {
    std::string shown;
    for (const std::string& a : bad.args) shown += a + " ";
    SCOPED_TRACE("train_gpt " + shown);
    const Result r = run_train_gpt(bad.args);
    EXPECT_EQ(r.status, bad.status) << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
    EXPECT_TRUE(r.err.starts_with("train_gpt: ")) << r.err;
    EXPECT_NE(r.err.find(bad.names), std::string::npos) << r.err;
    EXPECT_LE(r.err.size(), 300u) << r.err;
  }
}

// Every flag of --help with its default ("" for a switch or no default).
std::map<std::string, std::string> help_flags(const std::string& help) {
  std::map<std::string, std::string> flags;
  const std::regex line(R"(^\s+(--[a-z-]+)(?: [A-Z]+)?\s+(.*)$)");
  const std::regex dflt(R"(\(default ([^;)]*)[;)])");
  std::istringstream in(help);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_match(l, m, line) || m[1] == "--help") continue;
    std::smatch d;
    const std::string rest = m[2];
    std::string value = std::regex_search(rest, d, dflt) ? d[1].str() : "";
    while (!value.empty() && value.back() == ' ') value.pop_back();  // as the table's cells
    flags[m[1]] = value;
  }
  return flags;
}

// The rows of the "## Flags" table in docs/training.md: `--flag` -> its default cell.
std::map<std::string, std::string> documented_flags(const std::string& doc) {
  std::map<std::string, std::string> flags;
  const size_t start = doc.find("\n## Flags");
  EXPECT_NE(start, std::string::npos) << "docs/training.md has no '## Flags' section";
  if (start == std::string::npos) return flags;
  const size_t end = doc.find("\n## ", start + 1);
  std::istringstream in(doc.substr(start, end - start));
  const std::regex row(R"(^\| `(--[a-z-]+)` \| ([^|]*) \|)");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, row)) {
      std::string cell = m[2];
      cell.erase(std::remove(cell.begin(), cell.end(), '`'), cell.end());
      while (!cell.empty() && cell.back() == ' ') cell.pop_back();
      flags[m[1]] = cell;
    }
  }
  return flags;
}

TEST(TrainGptCliTest, TrainingDocFlagTableMatchesHelp) {
  const Result help = run_train_gpt({"--help"});
  ASSERT_EQ(help.status, 0) << help.err;
  const auto want = help_flags(help.out);
  ASSERT_GT(want.size(), 25u) << help.out;
  const auto got = documented_flags(slurp(TRAINING_DOC_PATH));
  for (const auto& [flag, value] : want) {
    SCOPED_TRACE(flag);
    ASSERT_TRUE(got.contains(flag)) << flag << " is in --help but not in docs/training.md's table";
    const std::string& cell = got.at(flag);
    if (value.empty()) {
      EXPECT_TRUE(cell == "off" || cell == "none") << "documented default '" << cell << "'";
    } else if (value.find('/') != std::string::npos) {  // a path: the doc names its tail
      EXPECT_TRUE(value.ends_with(cell)) << value << " does not end with '" << cell << "'";
    } else {
      EXPECT_EQ(cell, value) << "docs/training.md's default differs from --help's";
    }
  }
  for (const auto& [flag, cell] : got) {
    EXPECT_TRUE(want.contains(flag)) << flag << " is documented but train_gpt has no such flag";
  }
}

}  // namespace
