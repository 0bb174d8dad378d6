// tessel-run end to end on one node: the worker environment against torchrun's specification,
// isolation of concurrent jobs, no orphans after kill -9, failure propagation and reports,
// restart limits, bad input, whole lines, signals.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "child_process.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;

const std::string kRun = TESSEL_RUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;

std::vector<std::string> run_args(std::vector<std::string> flags, std::vector<std::string> worker) {
  std::vector<std::string> argv{kRun};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker.begin(), worker.end());
  return argv;
}

// "[0:R] ENV NAME=value" lines -> rank -> name -> value.
std::map<int, std::map<std::string, std::string>> worker_envs(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> envs;
  std::istringstream in(out);
  std::string line;
  const std::regex re(R"(^\[0:(\d+)\] ENV ([^=]+)=(.*)$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, re)) envs[std::stoi(m[1])][m[2]] = m[3];
  }
  return envs;
}

class TesselRunEnvTest : public ::testing::TestWithParam<int> {};

// torchrun's worker environment for one node of nproc workers, written out independently.
TEST_P(TesselRunEnvTest, MatchesTorchrunSpecification) {
  const int nproc = GetParam();
  const std::string dir = testing::make_temp_dir("env");
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", std::to_string(nproc),
                             "--max-restarts", "2", "--rdzv-id", "job42", "--log-dir", dir},
                            {"env"}),
                   {}, dir + "/run");
  const char* outer_omp = std::getenv("OMP_NUM_THREADS");
  ASSERT_EQ(run.wait(60s), 0) << run.err();
  auto envs = worker_envs(run.out());
  ASSERT_EQ(envs.size(), static_cast<size_t>(nproc)) << run.out();
  std::set<std::string> ports, addrs, tokens;
  for (int r = 0; r < nproc; ++r) {
    auto& e = envs[r];
    const std::map<std::string, std::string> expected = {
        {"RANK", std::to_string(r)},
        {"LOCAL_RANK", std::to_string(r)},
        {"GROUP_RANK", "0"},
        {"ROLE_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
        {"WORLD_SIZE", std::to_string(nproc)},
        {"GROUP_WORLD_SIZE", "1"},
        {"ROLE_WORLD_SIZE", std::to_string(nproc)},
        {"ROLE_NAME", "default"},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"TORCHELASTIC_MAX_RESTARTS", "2"},
        {"TORCHELASTIC_RUN_ID", "job42"},
    };
    for (const auto& [k, v] : expected) EXPECT_EQ(e[k], v) << "rank " << r << " " << k;
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_GT(std::stoi(e["MASTER_PORT"]), 0);
    // torchrun sets OMP_NUM_THREADS=1 only with several workers and when it is unset.
    if (outer_omp != nullptr) {
      EXPECT_EQ(e["OMP_NUM_THREADS"], outer_omp);
    } else if (nproc > 1) {
      EXPECT_EQ(e["OMP_NUM_THREADS"], "1");
    } else {
      EXPECT_EQ(e.count("OMP_NUM_THREADS"), 0u);
    }
    EXPECT_EQ(e["TESSEL_STORE_ADDR"].rfind("127.0.0.1:", 0), 0u);
    EXPECT_EQ(e["TESSEL_STORE_TOKEN"].size(), 64u);
    ports.insert(e["MASTER_PORT"]);
    addrs.insert(e["TESSEL_STORE_ADDR"]);
    tokens.insert(e["TESSEL_STORE_TOKEN"]);
  }
  EXPECT_EQ(ports.size(), 1u);
  EXPECT_EQ(addrs.size(), 1u);
  ASSERT_EQ(tokens.size(), 1u);
  // The token is in the workers' environment only: not in the launcher's own output or logs.
  const std::string token = *tokens.begin();
  EXPECT_EQ(run.err().find(token), std::string::npos);
  EXPECT_EQ(testing::read_file(dir + "/attempt_0/rank_0.stderr.log").find(token),
            std::string::npos);
}
INSTANTIATE_TEST_SUITE_P(Nproc, TesselRunEnvTest, ::testing::Values(1, 3));

TEST(TesselRunTest, TwoStandaloneJobsDoNotCollide) {
  const std::string dir = testing::make_temp_dir("two");
  const std::string go = dir + "/go";
  ChildProcess a(
      run_args({"--standalone", "--nproc-per-node", "2", "--log-dir", dir + "/a"}, {"await", go}),
      {}, dir + "/a");
  ChildProcess b(
      run_args({"--standalone", "--nproc-per-node", "2", "--log-dir", dir + "/b"}, {"await", go}),
      {}, dir + "/b");
  // Both jobs' workers are up at the same time before either may finish.
  ASSERT_TRUE(testing::wait_until(
      [&] { return worker_envs(a.out()).size() == 2 && worker_envs(b.out()).size() == 2; }, 30s))
      << a.err() << b.err();
  { std::ofstream(go) << "go"; }
  ASSERT_EQ(a.wait(30s), 0) << a.err();
  ASSERT_EQ(b.wait(30s), 0) << b.err();
  auto ea = worker_envs(a.out()), eb = worker_envs(b.out());
  EXPECT_NE(ea[0]["TESSEL_STORE_ADDR"], eb[0]["TESSEL_STORE_ADDR"]);
  EXPECT_NE(ea[0]["MASTER_PORT"], eb[0]["MASTER_PORT"]);
  EXPECT_NE(ea[0]["TESSEL_STORE_TOKEN"], eb[0]["TESSEL_STORE_TOKEN"]);
}

// Three workers on one node form a Gloo world through the store tessel-run hosts.
TEST(TesselRunTest, WorkersAllReduceOverGlooThroughTheJobStore) {
  const std::string dir = testing::make_temp_dir("allreduce");
  ChildProcess run(
      run_args({"--standalone", "--nproc-per-node", "3", "--log-dir", dir}, {"all_reduce"}), {},
      dir + "/run");
  ASSERT_EQ(run.wait(60s), 0) << run.err();
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(run.out().find(fmt::format("all_reduce rank {} of 3 sum 6", r)), std::string::npos)
        << run.out() << run.err();
  }
}

// The whole hang path: rank 1 stops taking part, the others' collective times out (exit 124),
// every rank (rank 1 too, still alive) dumps through the job's store, and the launcher's
// tessel-trace verdict names rank 1.
TEST(TesselRunTest, HungRankIsNamedByTheLaunchersVerdict) {
  const std::string dir = testing::make_temp_dir("hangjob");
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", "3", "--log-dir", dir,
                             "--hang-dump-timeout", "20s"},
                            {"hang", "1"}),
                   {"TESSEL_FR_DUMP_DIR=" + dir + "/fr"}, dir + "/run");
  ASSERT_EQ(run.wait(90s), 124) << run.err();
  EXPECT_NE(run.err().find("verdict: CULPRIT FOUND: rank 1"), std::string::npos) << run.err();
}

// Every launcher path of a hang prints a verdict naming the rank at fault, without waiting for
// ranks known to be dead: a rank that stays out (its peers time out, exit 124, or lose it, exit
// 1, in either reaping order), one that crashes (its fatal-signal dump, posted by its agent,
// says so), one that is SIGKILLed (no dump; its agent recovers its ring file), and one that
// exits cleanly too early. The hang-dump timeout is 30 s; the job must
// end well before it.
TEST(TesselRunTest, EveryHangPathPrintsAVerdictWithoutWaitingForTheDead) {
  struct Case {
    std::string kind;
    std::vector<std::string> words;
    int status;  // the root cause's: a timeout (124), the crash (128 + SIGSEGV), a lost peer (1)
  };
  for (const Case& c :
       {Case{"hang", {"verdict: CULPRIT FOUND: rank 1\n", "[not_joined] rank 1"}, 124},
        Case{"crash", {"verdict: CULPRIT FOUND: rank 1\n", "crashed (SIGSEGV)"}, 128 + SIGSEGV},
        Case{"kill",
             {"verdict: CULPRIT FOUND: rank 1\n", "rank 1: crashed (SIGKILL)"},
             128 + SIGKILL},
        Case{"exit",
             {"verdict: CULPRIT FOUND: rank 1\n", "rank 1: exited with status 0, no dump"},
             1}}) {
    const std::string dir = testing::make_temp_dir("hangpath_" + c.kind);
    const auto start = std::chrono::steady_clock::now();
    ChildProcess run(run_args({"--standalone", "--nproc-per-node", "3", "--log-dir", dir,
                               "--hang-dump-timeout", "30s"},
                              {"fault", c.kind, "1"}),
                     {"TESSEL_FR_DUMP_DIR=" + dir + "/fr"}, dir + "/run");
    const int status = run.wait(90s).value_or(-1);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(status, c.status) << c.kind << run.err();
    for (const auto& w : c.words) EXPECT_NE(run.err().find(w), std::string::npos) << w << run.err();
    // A correctness bound (the dead rank is not waited for), with slack for a loaded machine.
    EXPECT_LT(took, 25s) << c.kind << run.err();
  }
}

// The whole path on a mesh: four workers form a 2x2 (dp, tp) mesh and rank 1 leaves out a tp
// all_reduce in step 2. The job shifts and hangs at its end; the printed verdict names rank 1
// only, with its step evidence.
TEST(TesselRunTest, MeshSkipIsNamedByTheLaunchersVerdict) {
  const std::string dir = testing::make_temp_dir("meshskip");
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", "4", "--log-dir", dir,
                             "--hang-dump-timeout", "30s"},
                            {"mesh-skip", "1"}),
                   {"TESSEL_FR_DUMP_DIR=" + dir + "/fr"}, dir + "/run");
  EXPECT_NE(run.wait(90s).value_or(-1), 0) << run.err();
  for (const char* words :
       {"verdict: CULPRIT FOUND: rank 1\n",
        "rank 1 issued 0 collectives on 'tp' in step 2, where 3 other members of 'tp' groups"}) {
    EXPECT_NE(run.err().find(words), std::string::npos) << words << "\n" << run.err();
  }
}

// Elastic scale-up: a 1:2 job runs on one node; a second node arriving ends that round and the
// next one runs on both (WORLD_SIZE 2 everywhere), without spending the restart budget.
TEST(TesselRunTest, ArrivingNodeScalesTheJobUp) {
  const std::string dir = testing::make_temp_dir("scaleup");
  const std::string token = dir + "/token";
  { std::ofstream(token) << "scale-up-test-token"; }
  chmod(token.c_str(), 0600);
  const std::string go = dir + "/go";
  const std::string endpoint = fmt::format("127.0.0.1:{}", testing::free_port());
  auto node = [&](int rank) {
    return run_args(
        {"--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--node-rank",
         std::to_string(rank), "--rdzv-token-file", token, "--last-call-timeout", "300ms",
         "--max-restarts", "0", "--log-dir", dir + "/node" + std::to_string(rank)},
        {"await", go});
  };
  // "WORLD_SIZE=" values a node's workers printed, in order.
  auto world_sizes = [](const std::string& out) {
    std::vector<std::string> sizes;
    std::istringstream in(out);
    std::smatch m;
    const std::regex re(R"(^\[\d+:\d+\] ENV WORLD_SIZE=(\d+)$)");
    for (std::string line; std::getline(in, line);) {
      if (std::regex_match(line, m, re)) sizes.push_back(m[1]);
    }
    return sizes;
  };
  ChildProcess a(node(0), {}, dir + "/a");
  ASSERT_TRUE(testing::wait_until([&] { return !world_sizes(a.out()).empty(); }, 30s)) << a.err();
  EXPECT_EQ(world_sizes(a.out()).front(), "1");
  ChildProcess b(node(1), {}, dir + "/b");
  ASSERT_TRUE(testing::wait_until(
      [&] { return world_sizes(a.out()).size() >= 2 && !world_sizes(b.out()).empty(); }, 30s))
      << a.err() << b.err();
  EXPECT_EQ(world_sizes(a.out()).back(), "2");
  EXPECT_EQ(world_sizes(b.out()).back(), "2");
  { std::ofstream(go) << "go"; }
  EXPECT_EQ(a.wait(30s), 0) << a.err();
  EXPECT_EQ(b.wait(30s), 0) << b.err();
}

TEST(TesselRunTest, KillNineOfTheAgentLeavesNoDescendant) {
  const std::string dir = testing::make_temp_dir("kill9");
  const std::string marker = "LAUNCH_TEST_MARKER=" + dir;
  ChildProcess run(
      run_args({"--standalone", "--nproc-per-node", "3", "--log-dir", dir}, {"grandchild", dir}),
      {marker}, dir + "/run");
  std::vector<pid_t> pids;
  ASSERT_TRUE(testing::wait_until(
      [&] {
        for (int r = 0; r < 3; ++r) {
          if (testing::read_file(dir + "/pids_" + std::to_string(r)).empty()) return false;
        }
        return true;
      },
      30s))
      << run.err();
  for (int r = 0; r < 3; ++r) {
    std::istringstream in(testing::read_file(dir + "/pids_" + std::to_string(r)));
    pid_t worker, grandchild;
    in >> worker >> grandchild;
    pids.push_back(worker);
    pids.push_back(grandchild);
  }
  // Each process is watched through a pidfd opened while it is still the job's: after it ends
  // its pid may be reused by another test's process within seconds (pid_max 32,768), which is
  // how a pid check once saw two "survivors" under `ctest -j2` at load 280.
  std::vector<int> pidfds;
  for (pid_t p : pids) {
    const int fd = testing::open_pidfd(p);
    ASSERT_GE(fd, 0) << p;
    pidfds.push_back(fd);
    ASSERT_TRUE(testing::process_alive(p)) << testing::describe_process(p);
  }
  const std::vector<pid_t> job = testing::pids_with_env(marker);
  for (pid_t p : pids) {  // the pidfds are the job's processes, not pids reused meanwhile
    ASSERT_NE(std::find(job.begin(), job.end(), p), job.end()) << testing::describe_process(p);
  }
  run.signal(SIGKILL);
  EXPECT_EQ(run.wait(10s), 128 + SIGKILL);
  EXPECT_TRUE(testing::wait_until([&] { return testing::pids_with_env(marker).empty(); }, 30s))
      << testing::pids_with_env(marker).size() << " processes of the job are still alive";
  // A process in the middle of dying has already dropped its memory (so its environment reads
  // empty and pids_with_env no longer sees it) but is not yet a zombie: wait for each to end.
  for (size_t i = 0; i < pids.size(); ++i) {
    EXPECT_TRUE(testing::wait_pidfd_exited(pidfds[i], 30s)) << testing::describe_process(pids[i]);
    close(pidfds[i]);
  }
}

long long read_ns(const std::string& path) {
  const std::string text = testing::read_file(path);
  return text.empty() ? -1 : std::stoll(text);
}

TEST(TesselRunTest, FailingWorkerStopsTheOthersWithinOneSecondAndIsTheRootCause) {
  const std::string dir = testing::make_temp_dir("fail");
  const int nproc = 4, bad = 2;
  ChildProcess run(
      run_args({"--standalone", "--nproc-per-node", std::to_string(nproc), "--log-dir", dir},
               {"fail", std::to_string(bad), "1", dir}),
      {}, dir + "/run");
  ASSERT_EQ(run.wait(30s), 1) << run.err();
  const std::string err = run.err();
  EXPECT_NE(err.find("rank 2 (local rank 2)"), std::string::npos) << err;
  EXPECT_NE(err.find("exited with code 1"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 2 giving up: simulated failure"), std::string::npos) << err;
  const auto report = nlohmann::json::parse(testing::read_file(dir + "/failure.json"));
  EXPECT_EQ(report["rank"], bad);
  EXPECT_EQ(report["exit_code"], 1);
  EXPECT_EQ(report["exit_status"], 1);
  EXPECT_NE(report["stderr_tail"].get<std::string>().find("simulated failure"), std::string::npos);
  const long long failed_at = read_ns(dir + "/failed_at");
  ASSERT_GT(failed_at, 0);
  for (int r = 0; r < nproc; ++r) {
    if (r == bad) continue;
    const long long stopped = read_ns(dir + "/stopped_" + std::to_string(r));
    ASSERT_GT(stopped, 0) << "rank " << r << " never got SIGTERM";
    EXPECT_LT(stopped - failed_at, 1'000'000'000LL) << "rank " << r;
  }
}

TEST(TesselRunTest, MaxRestartsHoldsAgainstCrashLoop) {
  for (int max_restarts : {0, 2}) {
    const std::string dir = testing::make_temp_dir("crashloop");
    ChildProcess run(run_args({"--standalone", "--nproc-per-node", "2", "--max-restarts",
                               std::to_string(max_restarts), "--log-dir", dir},
                              {"crash"}),
                     {}, dir + "/run");
    ASSERT_EQ(run.wait(60s), 1) << run.err();
    for (int a = 0; a <= max_restarts; ++a) {
      struct stat st {};
      EXPECT_EQ(stat((dir + "/attempt_" + std::to_string(a)).c_str(), &st), 0) << a;
    }
    struct stat st {};
    EXPECT_NE(stat((dir + "/attempt_" + std::to_string(max_restarts + 1)).c_str(), &st), 0);
    const auto report = nlohmann::json::parse(testing::read_file(dir + "/failure.json"));
    EXPECT_EQ(report["restart_count"], max_restarts);
  }
}

// Every bad value: a one-line error naming it, and the documented exit status
// (docs/launching.md, "Exit status"). No case contacts anything but this host.
TEST(TesselRunTest, BadValuesTable) {
  const std::string dir = testing::make_temp_dir("bad");
  // Nothing listens there and no interface of this host holds it: refused at once.
  const std::string unreachable = fmt::format("127.0.0.2:{}", testing::free_port());
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> env;
    int status;
    std::string text;
  };
  const std::vector<Case> cases = {
      {{"--no-such-flag"}, {}, 64, "--no-such-flag"},
      {{"--nnodes", "3:2", "--rdzv-endpoint", "127.0.0.1:1"}, {}, 65, "3:2"},
      {{"--standalone", "--nproc-per-node", "0"}, {}, 65, "--nproc-per-node 0"},
      {{"--standalone", "--master-port", "70000"}, {}, 65, "--master-port 70000"},
      {{"--standalone", "--master-port", "-1"}, {}, 65, "--master-port -1"},
      {{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--node-rank", "-2"},
       {},
       65,
       "--node-rank -2"},
      {{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--node-rank", "2"},
       {},
       65,
       "--node-rank 2"},
      {{"--standalone", "--rdzv-timeout", "0"}, {}, 65, "--rdzv-timeout 0"},
      {{"--standalone", "--rdzv-connect-timeout", "0s"}, {}, 65, "--rdzv-connect-timeout 0s"},
      {{"--standalone", "--monitor-interval", "0"}, {}, 65, "--monitor-interval 0"},
      {{"--standalone", "--failure-grace", "-1s"}, {}, 65, "--failure-grace: duration '-1s'"},
      {{"--standalone", "--heartbeat-misses", "0"}, {}, 65, "--heartbeat-misses 0"},
      {{"--standalone", "--max-restarts", "-1"}, {}, 65, "--max-restarts -1"},
      {{"--standalone", "--log-prefix", "{bogus}"}, {}, 65, "{bogus}"},
      {{"--standalone", "--start-method", "thread"}, {}, 65, "thread"},
      {{"--standalone", "--rdzv-conf", "join_timeout"}, {}, 65, "join_timeout"},
      {{"--standalone", "--local-ranks-filter", "0,-1"}, {}, 65, "-1"},
      {{"--nnodes", "2", "--rdzv-endpoint", "[::1"}, {}, 65, "[::1"},
      {{"--nnodes", "2", "--rdzv-endpoint", "::1:29400"}, {}, 65, "brackets"},
      {{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:70000"}, {}, 65, "70000"},
      {{"--nnodes", "2"}, {}, 65, "--rdzv-endpoint"},
      {{"--standalone", "-m", "--no-python"}, {}, 65, "--no-python"},
      {{"--nnodes", "2", "--rdzv-endpoint", unreachable, "--rdzv-connect-timeout", "1s"},
       {"TESSEL_RDZV_TOKEN=t"},
       69,
       unreachable},
      // (The token is checked before anything is sent: 192.0.2.1 is never contacted.)
      {{"--nnodes", "2", "--rdzv-endpoint", "192.0.2.1:29400"},
       {"TESSEL_RDZV_TOKEN="},
       77,
       "TESSEL_RDZV_TOKEN"},
      {{"--nnodes", "2", "--rdzv-endpoint", "192.0.2.1:29400", "--rdzv-token-file",
        dir + "/no-such-token"},
       {},
       77,
       "no-such-token"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::vector<std::string> argv = run_args(c.flags, {"env"});
    ChildProcess run(argv, c.env, dir + "/case" + std::to_string(i));
    EXPECT_EQ(run.wait(30s), c.status) << i << ": " << run.err();
    EXPECT_NE(run.err().find(c.text), std::string::npos) << i << ": " << run.err();
    // One line (a note line or two may precede it, none here), no gRPC internals.
    const std::string err = run.err();
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << i << ": " << err;
  }
  // The program itself: not found (127), not executable (126).
  ChildProcess missing({kRun, "--standalone", dir + "/no-such-program"}, {}, dir + "/missing");
  EXPECT_EQ(missing.wait(30s), 127) << missing.err();
  EXPECT_NE(missing.err().find("no-such-program"), std::string::npos) << missing.err();
  { std::ofstream(dir + "/not-exec") << "data"; }
  ChildProcess not_exec({kRun, "--standalone", dir + "/not-exec"}, {}, dir + "/not-exec-run");
  EXPECT_EQ(not_exec.wait(30s), 126) << not_exec.err();
}

// Two nodes asking for the same --node-rank: the second is refused, naming the first.
TEST(TesselRunTest, DuplicateNodeRankIsRefused) {
  const std::string dir = testing::make_temp_dir("duprank");
  const std::string endpoint = fmt::format("127.0.0.1:{}", testing::free_port());
  auto node = [&](const std::string& tag) {
    return std::make_unique<ChildProcess>(
        run_args({"--nnodes", "3", "--rdzv-endpoint", endpoint, "--node-rank", "1",
                  "--rdzv-timeout", "20s", "--log-dir", dir + "/" + tag},
                 {"env"}),
        std::vector<std::string>{}, dir + "/" + tag);
  };
  auto a = node("a");
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::read_file(dir + "/a.err").empty() && a->wait(0ms) == std::nullopt; },
      5s));
  std::this_thread::sleep_for(500ms);  // a has joined
  auto b = node("b");
  EXPECT_EQ(b->wait(30s), 65) << b->err();
  EXPECT_NE(b->err().find("--node-rank 1 is already taken"), std::string::npos) << b->err();
  a->signal(SIGTERM);
  a->wait(30s);
}

// torchrun runs .py programs with Python; -m runs a module; --no-python runs the file itself.
TEST(TesselRunTest, PythonProgramsRunWithTheInterpreter) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 on PATH";
  const std::string dir = testing::make_temp_dir("python");
  {
    std::ofstream(dir + "/train.py")
        << "import os, sys\nprint('py rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'],"
           " 'args', sys.argv[1:])\n";
    std::ofstream(dir + "/tessel_probe_mod.py")
        << "import os\nprint('module rank', os.environ['RANK'])\n";
    std::ofstream(dir + "/direct.py") << "#!/bin/sh\necho direct $RANK\n";
  }
  chmod((dir + "/direct.py").c_str(), 0755);
  ChildProcess py({kRun, "--standalone", "--nproc-per-node", "2", dir + "/train.py", "--lr", "3"},
                  {}, dir + "/py");
  ASSERT_EQ(py.wait(60s), 0) << py.err();
  EXPECT_NE(py.out().find("py rank 1 of 2 args ['--lr', '3']"), std::string::npos) << py.out();
  ChildProcess mod({kRun, "--standalone", "-m", "tessel_probe_mod"}, {"PYTHONPATH=" + dir},
                   dir + "/mod");
  ASSERT_EQ(mod.wait(60s), 0) << mod.err();
  EXPECT_NE(mod.out().find("module rank 0"), std::string::npos) << mod.out();
  ChildProcess run_path({kRun, "--standalone", "--run-path", dir + "/train.py", "x"}, {},
                        dir + "/run_path");
  ASSERT_EQ(run_path.wait(60s), 0) << run_path.err();
  EXPECT_NE(run_path.out().find("py rank 0 of 1 args ['x']"), std::string::npos) << run_path.out();
  ChildProcess direct({kRun, "--standalone", "--no-python", dir + "/direct.py"}, {},
                      dir + "/direct");
  ASSERT_EQ(direct.wait(60s), 0) << direct.err();
  EXPECT_NE(direct.out().find("direct 0"), std::string::npos) << direct.out();
}

// torchrun's other flags are accepted: with their meaning, or a one-line note.
TEST(TesselRunTest, TorchrunFlagsAreAccepted) {
  const std::string dir = testing::make_temp_dir("torchrunflags");
  ChildProcess run(
      run_args({"--standalone", "--rdzv-backend", "c10d", "--rdzv-conf",
                "join_timeout=30,read_timeout=10,use_libuv=1", "--role", "trainer",
                "--start-method", "fork", "--logs-specs", "x", "--local-addr", "127.0.0.1",
                "--log-line-prefix-template", "${role_name}:${rank}", "--log-dir", dir},
               {"env"}),
      {}, dir + "/run");
  ASSERT_EQ(run.wait(60s), 0) << run.err();
  EXPECT_NE(run.out().find("trainer:0 ENV ROLE_NAME=trainer"), std::string::npos) << run.out();
  EXPECT_NE(run.err().find("note: --start-method fork"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("note: --logs-specs x"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("note: --rdzv-conf use_libuv=1"), std::string::npos) << run.err();
}

// A worker's TORCHELASTIC_ERROR_FILE (torchrun's @record format) reaches the report.
TEST(TesselRunTest, ErrorFileOfTheFailingWorkerIsReported) {
  const std::string dir = testing::make_temp_dir("errfile");
  ChildProcess run(
      run_args({"--standalone", "--nproc-per-node", "2", "--log-dir", dir}, {"error-file", "1"}),
      {}, dir + "/run");
  ASSERT_EQ(run.wait(60s), 1) << run.err();
  EXPECT_NE(run.err().find("ValueError: the loss is nan"), std::string::npos) << run.err();
  const auto report = nlohmann::json::parse(testing::read_file(dir + "/failure.json"));
  EXPECT_NE(report["error_file"].get<std::string>().find("the loss is nan"), std::string::npos);
  EXPECT_NE(report["error_file"].get<std::string>().find("train.py"), std::string::npos);
}

// --standalone gets a generated run id; default log directories go after success.
TEST(TesselRunTest, StandaloneRunIdAndDefaultLogsAreCleaned) {
  const std::string dir = testing::make_temp_dir("runid");
  ChildProcess run(run_args({"--standalone"}, {"env"}), {"TMPDIR=" + dir}, dir + "/run");
  ASSERT_EQ(run.wait(60s), 0) << run.err();
  auto env = worker_envs(run.out())[0];
  EXPECT_TRUE(
      std::regex_match(env["TORCHELASTIC_RUN_ID"],
                       std::regex("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")))
      << env["TORCHELASTIC_RUN_ID"];
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"].rfind(dir + "/tessel-run-", 0), 0u)
      << env["TORCHELASTIC_ERROR_FILE"];
  const std::string root = dir + "/tessel-run-" + std::to_string(getuid());
  EXPECT_TRUE(std::filesystem::is_empty(root)) << "log directory left after success";
  ChildProcess kept(run_args({"--standalone", "--keep-logs"}, {"env"}), {"TMPDIR=" + dir},
                    dir + "/kept");
  ASSERT_EQ(kept.wait(60s), 0) << kept.err();
  EXPECT_FALSE(std::filesystem::is_empty(root));
}

// Every node on this host: no token needed (the serving agent publishes one privately).
TEST(TesselRunTest, NoTokenWhenEveryNodeIsThisHost) {
  const std::string dir = testing::make_temp_dir("localtoken");
  const std::string endpoint = fmt::format("localhost:{}", testing::free_port());
  auto node = [&](const std::string& nnodes, const std::string& tag) {
    return std::make_unique<ChildProcess>(
        run_args({"--nnodes", nnodes, "--rdzv-endpoint", endpoint, "--log-dir", dir + "/" + tag},
                 {"env"}),
        std::vector<std::string>{"TESSEL_RDZV_TOKEN=", "TMPDIR=" + dir}, dir + "/" + tag);
  };
  auto one = node("1", "one");
  ASSERT_EQ(one->wait(60s), 0) << one->err();
  auto a = node("2", "a");
  auto b = node("2", "b");
  ASSERT_EQ(a->wait(60s), 0) << a->err();
  ASSERT_EQ(b->wait(60s), 0) << b->err();
  EXPECT_NE(a->out().find("ENV WORLD_SIZE=2"), std::string::npos) << a->out();
  EXPECT_NE(b->out().find("ENV WORLD_SIZE=2"), std::string::npos) << b->out();
}

TEST(TesselRunTest, LinesNeverInterleaveOrSplit) {
  const std::string dir = testing::make_temp_dir("lines");
  const int nproc = 3, lines = 300;
  ChildProcess run(
      run_args({"--standalone", "--nproc-per-node", std::to_string(nproc), "--log-dir", dir},
               {"lines", std::to_string(lines)}),
      {}, dir + "/run");
  ASSERT_EQ(run.wait(60s), 0) << run.err();
  const std::regex re("^\\[0:(\\d)\\] line (\\d+) rank (\\d) x{3000} end$");
  std::istringstream in(run.out());
  std::string line;
  std::map<int, int> next;  // per rank, lines arrive in order
  int count = 0;
  std::smatch m;
  while (std::getline(in, line)) {
    ASSERT_TRUE(std::regex_match(line, m, re)) << line.substr(0, 80);
    const int r = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[3]), r);
    EXPECT_EQ(std::stoi(m[2]), next[r]++);
    ++count;
  }
  EXPECT_EQ(count, nproc * lines);
}

TEST(TesselRunTest, SigtermIsForwardedAndTheJobExitsWithIt) {
  const std::string dir = testing::make_temp_dir("sigterm");
  const std::string marker = "LAUNCH_TEST_MARKER=" + dir;
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", "2", "--log-dir", dir}, {"sleep"}),
                   {marker}, dir + "/run");
  ASSERT_TRUE(testing::wait_until([&] { return testing::pids_with_env(marker).size() >= 3; }, 30s));
  run.signal(SIGTERM);
  EXPECT_EQ(run.wait(30s), 128 + SIGTERM) << run.err();
  EXPECT_TRUE(testing::wait_until([&] { return testing::pids_with_env(marker).empty(); }, 10s));
}

bool files_exist(const std::string& dir, const std::string& stem, int n) {
  for (int r = 0; r < n; ++r) {
    struct stat st {};
    if (stat((dir + "/" + stem + std::to_string(r)).c_str(), &st) != 0) return false;
  }
  return true;
}

TEST(TesselRunTest, Usr1IsForwardedAndASecondSigintKillsAtOnce) {
  const std::string dir = testing::make_temp_dir("signals");
  const int nproc = 3;
  // Workers ignore SIGINT; only the second SIGINT (SIGKILL) can end them before the 120 s grace.
  ChildProcess run(run_args({"--standalone", "--nproc-per-node", std::to_string(nproc),
                             "--signal-grace", "120s", "--log-dir", dir},
                            {"signals", dir}),
                   {}, dir + "/run");
  ASSERT_TRUE(testing::wait_until([&] { return files_exist(dir, "ready_", nproc); }, 30s));
  run.signal(SIGUSR1);
  EXPECT_TRUE(testing::wait_until([&] { return files_exist(dir, "usr1_", nproc); }, 10s));
  run.signal(SIGINT);
  ASSERT_TRUE(testing::wait_until([&] { return files_exist(dir, "int_", nproc); }, 10s));
  EXPECT_EQ(run.wait(0ms), std::nullopt);  // still in its grace period
  run.signal(SIGINT);
  EXPECT_EQ(run.wait(30s), 128 + SIGINT) << run.err();
}

// The hang path up to the store: a collective timeout (exit 124), or any failure with
// --dump-on-hang, makes the server ask for flight-recorder dumps before the round ends. Until
// the gRPC store is built in, that step says so instead of gathering.
TEST(TesselRunTest, CollectiveTimeoutOrDumpOnHangTriggersDumpGathering) {
  struct Case {
    std::vector<std::string> flags;
    std::string code;
    bool triggers;
  };
  for (const Case& c :
       {Case{{}, "124", true}, Case{{"--dump-on-hang"}, "1", true}, Case{{}, "1", false}}) {
    const std::string dir = testing::make_temp_dir("hangpath");
    // The test workers answer no dump request, so the gathering waits out its timeout.
    std::vector<std::string> flags = {
        "--standalone", "--nproc-per-node", "2", "--log-dir", dir, "--hang-dump-timeout", "1s"};
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    ChildProcess run(run_args(flags, {"fail", "1", c.code}), {}, dir + "/run");
    EXPECT_EQ(run.wait(60s), std::stoi(c.code)) << run.err();
    const bool asked = run.err().find("flight-recorder dumps") != std::string::npos;
    EXPECT_EQ(asked, c.triggers) << c.code << run.err();
  }
}

}  // namespace
}  // namespace tessel::launcher
