#include "tessel/base/logging.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "tessel/base/error.h"

namespace tessel {
namespace {

// Captures log lines for one test and restores the default levels and sink after.
class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ =
        set_log_sink([this](LogLevel, std::string_view line) { lines_.emplace_back(line); });
    set_log_rank(-1);
  }
  void TearDown() override {
    set_log_sink(std::move(previous_));
    configure_logging("");
  }
  std::vector<std::string> lines_;
  LogSink previous_;
};

TEST(LogSpecTest, DefaultIsWarnEverywhere) {
  for (LogLevel level : parse_log_spec("")) EXPECT_EQ(level, LogLevel::kWarn);
}

TEST(LogSpecTest, ItemsSetLevels) {
  const LogLevels levels = parse_log_spec("collectives=debug, +launcher,-tensor,mesh,nn=off");
  auto at = [&](LogComponent c) { return levels[static_cast<size_t>(c)]; };
  EXPECT_EQ(at(LogComponent::kCollectives), LogLevel::kDebug);
  EXPECT_EQ(at(LogComponent::kLauncher), LogLevel::kDebug);
  EXPECT_EQ(at(LogComponent::kTensor), LogLevel::kError);
  EXPECT_EQ(at(LogComponent::kMesh), LogLevel::kInfo);
  EXPECT_EQ(at(LogComponent::kNn), LogLevel::kOff);
  EXPECT_EQ(at(LogComponent::kBase), LogLevel::kWarn);
}

TEST(LogSpecTest, AllThenOverride) {
  const LogLevels levels = parse_log_spec("all=error,flight_recorder=trace");
  EXPECT_EQ(levels[static_cast<size_t>(LogComponent::kFlightRecorder)], LogLevel::kTrace);
  EXPECT_EQ(levels[static_cast<size_t>(LogComponent::kParallel)], LogLevel::kError);
}

TEST(LogSpecTest, UnknownComponentListsTheValidOnes) {
  try {
    parse_log_spec("collectives=debug,+dynamo");
    FAIL() << "accepted an unknown component";
  } catch (const InvalidArgument& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("unknown component 'dynamo'"), std::string::npos) << m;
    for (auto name : {"base", "tensor", "kernels", "nn", "flight_recorder", "collectives", "mesh",
                      "parallel", "launcher", "all"}) {
      EXPECT_NE(m.find(name), std::string::npos) << "missing " << name << " in: " << m;
    }
  }
}

TEST(LogSpecTest, UnknownLevelListsTheValidOnes) {
  try {
    parse_log_spec("mesh=loud");
    FAIL() << "accepted an unknown level";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("unknown level 'loud'"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("trace, debug, info, warn, error, off"), std::string::npos);
  }
}

TEST_F(LoggingTest, LevelsFilterPerComponent) {
  configure_logging("mesh=info");
  log_info(LogComponent::kMesh, "made {} groups", 3);
  log_info(LogComponent::kTensor, "hidden");
  log_debug(LogComponent::kMesh, "hidden too");
  log_warn(LogComponent::kTensor, "shown");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_NE(lines_[0].find("mesh] made 3 groups\n"), std::string::npos) << lines_[0];
  EXPECT_TRUE(lines_[0].starts_with("[I")) << lines_[0];
  EXPECT_NE(lines_[1].find("tensor] shown"), std::string::npos) << lines_[1];
  EXPECT_TRUE(lines_[1].starts_with("[W")) << lines_[1];
}

TEST_F(LoggingTest, RankPrefix) {
  configure_logging("");
  set_log_rank(5);
  log_error(LogComponent::kCollectives, "peer lost");
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find(" rank 5 collectives] peer lost"), std::string::npos) << lines_[0];
}

TEST_F(LoggingTest, ConcurrentLinesArriveWhole) {
  configure_logging("base=info");
  constexpr int kThreads = 8, kLines = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) log_info(LogComponent::kBase, "thread {} line {} end", t, i);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(lines_.size(), size_t{kThreads * kLines});
  for (const auto& line : lines_) {
    EXPECT_TRUE(line.ends_with(" end\n")) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;
  }
}

// The tool rejects a bad TESSEL_LOGS with the message and exit status 2.
TEST(LoggingToolTest, TesselInfoRejectsUnknownComponent) {
  const std::string command =
      std::string("TESSEL_LOGS=collectives=debug,+bogus ") + TESSEL_INFO_BIN + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe)) output += buffer;
  const int status = ::pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_NE(output.find("unknown component 'bogus'"), std::string::npos) << output;
  EXPECT_NE(output.find("valid components: base, tensor"), std::string::npos) << output;
}

}  // namespace
}  // namespace tessel
