// Hang verdicts on plain programs (tests/launcher/plain_hang_program.cc): the training loop a
// new user writes, with no help for the flight recorder beyond set_step, and one rank at fault.
// However the waiting ranks end (an uncaught Timeout's std::terminate, exit 1, exit 124, abort
// in a handler), the verdict names exactly the rank at fault and no waiting rank; under
// tessel-run the root-cause line, failure.json and the exit status say the same.
//
// Order races (which rank is reaped first, whether a victim's fatal-signal dump or its timeout
// dump is the one gathered, whether the late rank wakes before the launcher stops it) are
// covered by running the core scenarios several times each (kRepeats).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "child_process.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/launcher/hang_dump.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;

constexpr int kRepeats = 3;

struct Scenario {
  std::string handling, fault;
  int culprit;
  std::string group = "world";
  int ranks = 3;
  int status = kCollectiveTimeoutExitCode;  // tessel-run's, from the culprit's end
};

std::string name(const Scenario& s) {
  return fmt::format("{} {} rank {} on {} of {} ranks", s.handling, s.fault, s.culprit, s.group,
                     s.ranks);
}

std::vector<std::string> program(const Scenario& s) {
  return {PLAIN_HANG_PROGRAM_PATH, s.handling, s.fault, std::to_string(s.culprit), s.group};
}

std::string timeout_env(const Scenario& s) {
  // More processes than cores: give the healthy steps room.
  return fmt::format("TEST_TIMEOUT_MS={}", s.ranks > 4 ? 6000 : 3000);
}

std::string verdict_text(const fr::Verdict& v) { return fr::format_verdict(v); }

// Runs the program as `ranks` plain processes over a file store (no launcher), waits for every
// rank but a stopped culprit to end, stops that one once its dump is written, and analyzes the
// dumps the ranks wrote themselves.
fr::Verdict run_without_launcher(const Scenario& s, const std::string& dir) {
  const std::string dumps = dir + "/fr";
  std::filesystem::create_directories(dumps);
  std::filesystem::create_directories(dir + "/store");
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < s.ranks; ++r) {
    ranks.push_back(std::make_unique<ChildProcess>(
        program(s),
        std::vector<std::string>{
            fmt::format("RANK={}", r), fmt::format("WORLD_SIZE={}", s.ranks),
            fmt::format("LOCAL_RANK={}", r), fmt::format("LOCAL_WORLD_SIZE={}", s.ranks),
            "TESSEL_STORE_DIR=" + dir + "/store", "TESSEL_FR_DUMP_DIR=" + dumps,
            "TORCHELASTIC_RUN_ID=plain-" + std::to_string(getpid()), timeout_env(s)},
        fmt::format("{}/rank{}", dir, r)));
  }
  for (int r = 0; r < s.ranks; ++r) {
    if (r == s.culprit && s.fault == "stop") continue;
    EXPECT_TRUE(ranks[r]->wait(60s).has_value()) << name(s) << ": rank " << r << " did not end";
  }
  // The folder the ranks dumped into: TESSEL_FR_DUMP_DIR, or the job's folder inside it.
  auto folder_of = [&](int rank) -> std::optional<std::string> {
    const std::string file = fmt::format("tessel_fr_rank{}.json", rank);
    for (const auto& e : std::filesystem::recursive_directory_iterator(dumps)) {
      if (e.path().filename() == file) return e.path().parent_path().string();
    }
    return std::nullopt;
  };
  if (s.fault == "stop") {
    // It answered the others' dump request while stopped; then it is only in the way.
    EXPECT_TRUE(testing::wait_until([&] { return folder_of(s.culprit).has_value(); }, 30s))
        << name(s) << ": the stopped rank never dumped";
    ranks[s.culprit]->signal(SIGKILL);
  }
  for (auto& r : ranks) (void)r->wait(10s);
  const auto where = folder_of(s.culprit == 0 ? 1 : 0);
  if (!where) {
    ADD_FAILURE() << name(s) << ": no dumps under " << dumps;
    return {};
  }
  return fr::analyze_dump_dir(*where).verdict;
}

void expect_exactly_the_culprit(const fr::Verdict& v, const Scenario& s) {
  EXPECT_EQ(v.status, fr::VerdictStatus::kCulpritFound) << name(s) << "\n" << verdict_text(v);
  EXPECT_EQ(v.culprits, std::vector<int>{s.culprit}) << name(s) << "\n" << verdict_text(v);
}

TEST(HangVerdictTest, PlainProgramsWithoutALauncherNameOnlyTheRankAtFault) {
  const std::vector<Scenario> cases = {
      {"none", "stop", 1},
      {"none", "late", 1},
      {"exit1", "stop", 2},
      {"exit124", "late", 0, "world", 4},
      {"abort", "late", 2, "tp", 4},
      {"none", "stop", 3, "dp", 4},
      {"exit124", "skip", 2, "dp", 4},
      {"none", "leave", 3, "tp", 4},
      {"exit1", "skip", 6, "tp", 8},
  };
  for (const Scenario& s : cases) {
    const int repeats = s.handling == "none" && s.ranks == 3 ? kRepeats : 1;
    for (int i = 0; i < repeats; ++i) {
      SCOPED_TRACE(name(s) + fmt::format(", run {}", i));
      const std::string dir = testing::make_temp_dir("plain_direct");
      expect_exactly_the_culprit(run_without_launcher(s, dir), s);
      std::filesystem::remove_all(dir);
    }
  }
}

// Through tessel-run: the printed verdict, the root-cause line, failure.json and the exit status
// tell one story.
void run_with_launcher(const Scenario& s) {
  const std::string dir = testing::make_temp_dir("plain_run");
  ChildProcess run({TESSEL_RUN_PATH, "--standalone", "--nproc-per-node", std::to_string(s.ranks),
                    "--log-dir", dir, "--hang-dump-timeout", "30s", PLAIN_HANG_PROGRAM_PATH,
                    s.handling, s.fault, std::to_string(s.culprit), s.group},
                   {"TESSEL_FR_DUMP_DIR=" + dir + "/fr", timeout_env(s)}, dir + "/run");
  const int status = run.wait(120s).value_or(-1);
  const std::string err = run.err();
  EXPECT_EQ(status, s.status) << err;
  EXPECT_NE(err.find(fmt::format("verdict: CULPRIT FOUND: rank {}\n", s.culprit)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(fmt::format("root cause (the flight recorder's verdict, CULPRIT FOUND: "
                                 "rank {};",
                                 s.culprit)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(fmt::format("\n  rank {} ", s.culprit)), std::string::npos) << err;
  std::ifstream in(dir + "/failure.json");
  ASSERT_TRUE(in.good()) << "no failure.json\n" << err;
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("rank").get<int>(), s.culprit) << j.dump(2);
  EXPECT_EQ(j.at("culprits").get<std::vector<int>>(), std::vector<int>{s.culprit}) << j.dump(2);
  EXPECT_EQ(j.at("exit_status").get<int>(), s.status) << j.dump(2);
  EXPECT_EQ(j.at("verdict").get<std::string>(), fmt::format("CULPRIT FOUND: rank {}", s.culprit));
  std::filesystem::remove_all(dir);
}

TEST(HangVerdictTest, PlainProgramsUnderTesselRunTellOneStory) {
  const std::vector<Scenario> cases = {
      {"none", "stop", 1},
      {"none", "late", 1},
      {"exit1", "stop", 0, "world", 4},
      {"exit124", "late", 3, "world", 4},
      {"abort", "stop", 3, "tp", 4},
      {"none", "skip", 1, "tp", 4},
      {"none", "leave", 2},
      {"none", "crash", 2, "world", 3, 128 + SIGSEGV},
      {"exit1", "exit", 1, "world", 3, 1},
      {"none", "stop", 5, "world", 8},
  };
  for (const Scenario& s : cases) {
    const int repeats = s.handling == "none" && s.ranks == 3 && s.fault != "crash" ? kRepeats : 1;
    for (int i = 0; i < repeats; ++i) {
      SCOPED_TRACE(name(s) + fmt::format(", run {}", i));
      run_with_launcher(s);
    }
  }
}

// An ordinary configuration error on every rank, before any collective: no rank waits in one, so
// the job ends with the worker's own message and status, not as a hang.
TEST(HangVerdictTest, AConfigurationErrorEndsWithItsMessageNotAVerdict) {
  const std::string dir = testing::make_temp_dir("plain_config");
  ChildProcess run({TESSEL_RUN_PATH, "--standalone", "--nproc-per-node", "3", "--log-dir", dir,
                    PLAIN_HANG_PROGRAM_PATH, "exit1", "config", "0"},
                   {"TESSEL_FR_DUMP_DIR=" + dir + "/fr"}, dir + "/run");
  EXPECT_EQ(run.wait(120s).value_or(-1), 1) << run.err();
  const std::string err = run.err();
  EXPECT_EQ(err.find("verdict:"), std::string::npos) << err;
  EXPECT_EQ(err.find("CULPRIT"), std::string::npos) << err;
  EXPECT_NE(err.find("root cause (first failure by the server's clock"), std::string::npos) << err;
  EXPECT_NE(err.find("mesh shape"), std::string::npos) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessel::launcher
