#include "tessel/launcher/exec_path.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace tessel::launcher {
namespace {

// Sets PATH (or unsets it for nullopt) for one test and restores it after.
class ScopedPath {
 public:
  explicit ScopedPath(const std::optional<std::string>& value) {
    if (const char* old = std::getenv("PATH")) old_ = old;
    if (value) {
      setenv("PATH", value->c_str(), 1);
    } else {
      unsetenv("PATH");
    }
  }
  ~ScopedPath() {
    if (old_) {
      setenv("PATH", old_->c_str(), 1);
    } else {
      unsetenv("PATH");
    }
  }

 private:
  std::optional<std::string> old_;
};

// A fresh directory holding an executable `tool` and a non-executable `data`.
class ExecPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/tessel-exec-path-test-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
    std::ofstream(dir_ + "/tool") << "#!/bin/sh\n";
    chmod((dir_ + "/tool").c_str(), 0755);
    std::ofstream(dir_ + "/data") << "not a program\n";
    chmod((dir_ + "/data").c_str(), 0644);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(ExecPathTest, SearchPathIsPathOrTheDefaultWhenUnset) {
  {
    ScopedPath path("/opt/a:/opt/b");
    EXPECT_EQ(program_search_path(), "/opt/a:/opt/b");
  }
  {
    ScopedPath path(std::nullopt);
    EXPECT_EQ(program_search_path(), kDefaultProgramPath);
    EXPECT_EQ(std::string(kDefaultProgramPath), "/usr/bin:/bin");
  }
  {
    ScopedPath path("");  // set but empty is kept (the current directory)
    EXPECT_EQ(program_search_path(), "");
  }
}

TEST_F(ExecPathTest, FindsTheFirstExecutableMatchOnPath) {
  ScopedPath path("/nonexistent:" + dir_ + ":/usr/bin:/bin");
  EXPECT_EQ(find_program("tool"), dir_ + "/tool");
  EXPECT_EQ(resolve_program("tool", dir_), dir_ + "/tool");
}

TEST_F(ExecPathTest, UnsetPathSearchesTheDefault) {
  ScopedPath path(std::nullopt);
  const std::string sh = find_program("sh");
  EXPECT_TRUE(sh == "/usr/bin/sh" || sh == "/bin/sh") << sh;
  try {
    find_program("tool");
    FAIL() << "found a program that is on no directory of the default path";
  } catch (const ProgramError& e) {
    EXPECT_EQ(e.exit_status(), 127);
    EXPECT_EQ(e.message(), "program 'tool' not found on PATH (/usr/bin:/bin)");
  }
}

TEST_F(ExecPathTest, EmptyPathEntryIsTheCurrentDirectory) {
  const std::string cwd = std::filesystem::current_path();
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  EXPECT_EQ(resolve_program("tool", "/nonexistent:"), "./tool");
  EXPECT_EQ(resolve_program("tool", ""), "./tool");
  ASSERT_EQ(chdir(cwd.c_str()), 0);
}

TEST_F(ExecPathTest, NonExecutableFilesAreSkippedOnPathAndRefusedByPath) {
  EXPECT_THROW(resolve_program("data", dir_), ProgramError);
  try {
    resolve_program(dir_ + "/data", "");
    FAIL() << "a non-executable file was accepted";
  } catch (const ProgramError& e) {
    EXPECT_EQ(e.exit_status(), 126);
  }
  try {
    resolve_program(dir_ + "/missing", "");
    FAIL() << "a missing file was accepted";
  } catch (const ProgramError& e) {
    EXPECT_EQ(e.exit_status(), 127);
    EXPECT_NE(e.message().find("does not exist"), std::string::npos) << e.message();
  }
  EXPECT_EQ(resolve_program(dir_ + "/tool", ""), dir_ + "/tool");  // a path is not searched
}

TEST_F(ExecPathTest, TraceToolOnPathOrGivenBack) {
  ScopedPath path(dir_);
  EXPECT_EQ(find_trace_tool("tool"), dir_ + "/tool");
  EXPECT_EQ(find_trace_tool("/nonexistent/tessel-trace"), "/nonexistent/tessel-trace");
  EXPECT_EQ(find_trace_tool("no-such-trace-tool"), "no-such-trace-tool");
}

}  // namespace
}  // namespace tessel::launcher
