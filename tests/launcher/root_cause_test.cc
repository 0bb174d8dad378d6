// The root cause after the hang path: the verdict's culprit with its evidence, the first failure
// kept as the symptom, and an exit status that follows how the culprit ended.
#include "tessel/launcher/root_cause.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "tessel/base/error.h"
#include "tessel/launcher/failure_report.h"

namespace tessel::launcher {
namespace {

// A verdict as tessel-trace writes it (--json-out), naming `culprits`, with rank 1 `where`.
std::string verdict_json(const std::string& status, const std::string& culprits,
                         const std::string& where) {
  return fmt::format(R"({{"status": "{}", "culprits": [{}], "world_size": 3, "dumps": 3,
    "findings": [{{"kind": "not_joined", "culprits": [{}], "waiting": [0, 2], "group_id": 1,
      "group_name": "world", "seq": 3, "summary": "rank 1 did not join all_reduce #3",
      "details": ["rank 1: in compute"]}}],
    "inconclusive": [], "suspects": [], "stragglers": [], "notes": [],
    "positions": [
      {{"rank": 0, "where": "in_operation", "summary": "stuck in all_reduce #3", "last_event": "", "step": 2}},
      {{"rank": 1, "where": "{}", "summary": "in compute for 2s", "last_event": "", "step": 2}},
      {{"rank": 2, "where": "in_operation", "summary": "stuck in all_reduce #3", "last_event": "", "step": 2}}]}})",
                     status, culprits, culprits, where);
}

proto::Failure first_reaped() {
  proto::Failure f;
  f.set_rank(0);
  f.set_local_rank(0);
  f.set_pid(100);
  f.set_host("node-a");
  f.set_signal(SIGABRT);
  f.set_reason("signal");
  f.set_stderr_tail("terminate called after throwing an instance of 'tessel::Timeout'");
  f.set_hang(true);
  return f;
}

HangReport report_with(const std::string& json, std::vector<WorkerExitRecord> exits = {}) {
  HangReport r;
  r.dump_dir = "/nonexistent";
  r.facts = parse_verdict_facts(json, "verdict.json");
  r.exits = std::move(exits);
  return r;
}

WorkerExitRecord exit_of(int rank, int code, int signal) {
  WorkerExitRecord e;
  e.exit.rank = rank;
  e.exit.exit_code = code;
  e.exit.signal = signal;
  e.pid = 200 + rank;
  e.local_rank = rank;
  e.host = "node-a";
  return e;
}

TEST(RootCauseTest, AHungCulpritIsTheRootCauseAndTheFirstFailureItsSymptom) {
  const auto f = hang_root_cause(first_reaped(),
                                 report_with(verdict_json("culprit_found", "1", "in_compute")));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank(), 1);
  EXPECT_EQ(f->verdict(), "CULPRIT FOUND: rank 1");
  EXPECT_EQ(root_cause_exit_status(*f), 124);
  EXPECT_EQ(f->symptom_rank(), 0);
  EXPECT_NE(f->symptom().find("killed by SIGABRT"), std::string::npos) << f->symptom();
  const std::string report = format_failure_report(*f, 0, 0);
  EXPECT_NE(report.find("root cause (the flight recorder's verdict, CULPRIT FOUND: rank 1;"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 1 did not join all_reduce #3"), std::string::npos) << report;
  EXPECT_NE(report.find("last lines of rank 0's stderr"), std::string::npos) << report;
  EXPECT_NE(report.find("exits with status 124"), std::string::npos) << report;
  const std::string json = failure_report_json(*f, 0);
  EXPECT_NE(json.find("\"culprits\": [\n    1\n  ]"), std::string::npos) << json;
}

TEST(RootCauseTest, TheExitStatusFollowsHowTheCulpritEnded) {
  struct Case {
    std::string where;
    int code, signal, status;
  };
  for (const Case& c :
       {Case{"crashed", -1, SIGSEGV, 128 + SIGSEGV}, Case{"no_dump", -1, SIGKILL, 128 + SIGKILL},
        Case{"exited", 0, 0, 1}, Case{"exited", 3, 0, 3}}) {
    SCOPED_TRACE(c.where);
    const auto f = hang_root_cause(
        first_reaped(),
        report_with(verdict_json("culprit_found", "1", c.where), {exit_of(1, c.code, c.signal)}));
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->rank(), 1);
    EXPECT_EQ(f->pid(), 201);
    EXPECT_EQ(root_cause_exit_status(*f), c.status);
  }
}

TEST(RootCauseTest, AVerdictThatNamesNobodyKeepsTheFirstFailureAndSaysSo) {
  const auto f =
      hang_root_cause(first_reaped(), report_with(verdict_json("inconclusive", "", "in_compute")));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank(), 0);
  EXPECT_EQ(f->verdict(), "INCONCLUSIVE");
  EXPECT_EQ(root_cause_exit_status(*f), 128 + SIGABRT);
  const std::string report = format_failure_report(*f, 0, 0);
  EXPECT_NE(report.find("the flight recorder's verdict is INCONCLUSIVE"), std::string::npos)
      << report;
}

TEST(RootCauseTest, NoVerdictLeavesTheReportedFailure) {
  HangReport r;
  EXPECT_FALSE(hang_root_cause(first_reaped(), r).has_value());
}

TEST(RootCauseTest, AMalformedVerdictIsRefusedWithItsName) {
  EXPECT_THROW(parse_verdict_facts("{\"status\": 3}", "x/verdict.json"), InvalidArgument);
  try {
    parse_verdict_facts("not json", "x/verdict.json");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("x/verdict.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel::launcher
