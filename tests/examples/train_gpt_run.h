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
#include <string>
#include <vector>

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

  static std::string on_four_ranks() {
    return fmt::format("'{}' --standalone --nproc-per-node 4 '{}'", TESSEL_RUN_PATH,
                       TRAIN_GPT_PATH);
  }

  std::string prefix_;
  fs::path dir_;
};

}  // namespace train_gpt_test
