#pragma once
// What the train_gpt tests share: a scratch folder per test, and train_gpt (alone or under
// tessel-run on 4 processes) run in it as a user runs it, its status and output captured.
// Needs TRAIN_GPT_PATH and TESSEL_RUN_PATH defined by the build.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/examples/train_gpt_log.h"

namespace train_gpt_test {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A fixture whose folder dir_ (under the system's temporary directory, named by `prefix`, the
// process and the test) exists during the test and is removed after it.
class TrainGptRunTest : public ::testing::Test {
 protected:
  explicit TrainGptRunTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("{}_{}_{}", prefix_, ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
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

  // The tiny model the train_gpt tests train: `layers` blocks of width 32 with 4 heads, batches
  // of 8 x 32 on one thread, `steps` steps logged to `log` in the scratch folder; then `more`.
  std::vector<std::string> tiny_training(int steps, int layers, const std::string& log,
                                         const std::vector<std::string>& more = {}) const {
    std::vector<std::string> args = {"--threads",    "1",
                                     "--steps",      std::to_string(steps),
                                     "--batch",      "8",
                                     "--seq",        "32",
                                     "--layers",     std::to_string(layers),
                                     "--embd",       "32",
                                     "--heads",      "4",
                                     "--sample",     "0",
                                     "--log-every",  "10",
                                     "--log-json",   log,
                                     "--checkpoint", (dir_ / (log + ".st")).string()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  // step -> loss of the --log-json file `log` in the scratch folder.
  std::map<int, double> losses(const std::string& log) const { return logged_losses(dir_ / log); }

  static std::string on_four_ranks() {
    return fmt::format("'{}' --standalone --nproc-per-node 4 '{}'", TESSEL_RUN_PATH,
                       TRAIN_GPT_PATH);
  }

  std::string prefix_;
  fs::path dir_;
};

}  // namespace train_gpt_test
