// Multi-node tessel-run jobs in network namespaces: each node is a namespace with one veth into
// a private "switch" namespace holding a bridge, on 10.77.1.0/24. Nothing is created in the
// root namespace; everything is deleted when the test ends. Needs root and `ip netns`;
// skipped with the reason otherwise.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "child_process.h"
#include "netns_cluster.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::NetnsCluster;
using testing::sh;
using testing::skip_reason;
using testing::write_token_file;

const std::string kRun = TESSEL_RUN_PATH;
const std::string kWorker = TEST_WORKER_PATH;
constexpr int kPort = 29400;

std::vector<std::array<int, 3>> attempts(const std::string& out);

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    cluster_ = std::make_unique<NetnsCluster>(3);
    if (!cluster_->ok()) GTEST_SKIP() << "could not build the namespace cluster (ip netns/veth)";
    dir_ = testing::make_temp_dir("netns");
    token_file_ = write_token_file(dir_, "netns-test-token");
  }
  void TearDown() override {
    nodes_.clear();  // kill agents before their namespaces go
    cluster_.reset();
  }

  // Starts node i's agent in its namespace.
  ChildProcess& start_node(int i, std::vector<std::string> flags, std::vector<std::string> worker,
                           std::vector<std::string> env = {}) {
    const bool nnodes_given = std::find(flags.begin(), flags.end(), "--nnodes") != flags.end();
    std::vector<std::string> argv{"ip",
                                  "netns",
                                  "exec",
                                  cluster_->ns(i),
                                  kRun,
                                  "--nnodes",
                                  nnodes_given ? flags[1] : "3",
                                  "--nproc-per-node",
                                  "2",
                                  "--rdzv-endpoint",
                                  NetnsCluster::addr(0) + ":" + std::to_string(kPort),
                                  "--node-rank",
                                  std::to_string(i),
                                  "--rdzv-token-file",
                                  token_file_,
                                  "--log-dir",
                                  dir_ + "/node" + std::to_string(i)};
    argv.insert(argv.end(), flags.begin() + (nnodes_given ? 2 : 0), flags.end());
    argv.push_back(kWorker);
    argv.insert(argv.end(), worker.begin(), worker.end());
    nodes_.push_back(std::make_unique<ChildProcess>(argv, env, dir_ + "/out" + std::to_string(i)));
    return *nodes_.back();
  }

  // Node i's agent exactly as docs/launching.md's multi-node example runs it (no --node-rank,
  // no --log-dir), on a host named node<i> that maps to 127.0.1.1.
  ChildProcess& start_docs_node(int i, std::vector<std::string> worker) {
    cluster_->debian_hosts(i);
    std::vector<std::string> argv{"ip",
                                  "netns",
                                  "exec",
                                  cluster_->ns(i),
                                  "unshare",
                                  "--uts",
                                  "sh",
                                  "-c",
                                  "hostname node" + std::to_string(i) + " && exec \"$0\" \"$@\"",
                                  kRun,
                                  "--nnodes",
                                  "3",
                                  "--nproc-per-node",
                                  "2",
                                  "--rdzv-endpoint",
                                  NetnsCluster::addr(0) + ":" + std::to_string(kPort),
                                  "--rdzv-id",
                                  "exp7",
                                  "--rdzv-token-file",
                                  token_file_,
                                  "--max-restarts",
                                  "3",
                                  kWorker};
    argv.insert(argv.end(), worker.begin(), worker.end());
    nodes_.push_back(std::make_unique<ChildProcess>(argv, std::vector<std::string>{},
                                                    dir_ + "/out" + std::to_string(i)));
    return *nodes_.back();
  }
  // Node 2's link goes down for LENGTH (the blip's own length, not a wait for a condition)
  // while every node's workers run (first-attempt-fails -1), then comes back. Returns each
  // node's "attempt A world W rank R" lines once every node exited 0.
  std::vector<std::vector<std::array<int, 3>>> blip_node_two(std::chrono::milliseconds length,
                                                             int max_restarts) {
    const std::vector<std::string> flags = {"--max-restarts", std::to_string(max_restarts),
                                            "--rdzv-timeout", "60s"};
    for (int i = 0; i < 3; ++i) {
      start_node(i, flags, {"first-attempt-fails", "-1"},
                 {"LAUNCH_TEST_MARKER=" + dir_ + "/n" + std::to_string(i)});
    }
    std::vector<std::vector<std::array<int, 3>>> seen;
    if (!testing::wait_until(
            [&] { return processes_of(0) >= 4 && processes_of(1) >= 4 && processes_of(2) >= 4; },
            30s)) {
      ADD_FAILURE() << "the workers did not start";
      return seen;
    }
    cluster_->cut(2);
    std::this_thread::sleep_for(length);
    cluster_->reconnect(2);
    for (int i = 0; i < 3; ++i) {
      auto& node = *nodes_[static_cast<size_t>(i)];
      EXPECT_EQ(node.wait(60s), 0) << node.err();
      seen.push_back(attempts(node.out()));
    }
    return seen;
  }

  size_t processes_of(int i) {
    return testing::pids_with_env("LAUNCH_TEST_MARKER=" + dir_ + "/n" + std::to_string(i)).size();
  }

  std::unique_ptr<NetnsCluster> cluster_;
  std::string dir_, token_file_;
  std::vector<std::unique_ptr<ChildProcess>> nodes_;
};

TEST_F(NetnsTest, ThreeNodesOfTwoWorkersFormAndExitZero) {
  // Every worker joins one Gloo world through the job's store and all_reduces across nodes;
  // Gloo binds the interface that reaches the rendezvous (found by tessel-run, not set here).
  for (int i = 0; i < 3; ++i) start_node(i, {}, {"all_reduce"});
  std::set<int> ranks;
  const std::regex re(R"(^\[(\d):(\d)\] all_reduce rank (\d) of 6 sum 21$)");
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(nodes_[static_cast<size_t>(i)]->wait(60s), 0)
        << nodes_[static_cast<size_t>(i)]->err();
    std::istringstream in(nodes_[static_cast<size_t>(i)]->out());
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
      ASSERT_TRUE(std::regex_match(line, m, re)) << line;
      EXPECT_EQ(std::stoi(m[1]), i);                // node prefix = group rank = --node-rank
      EXPECT_EQ(std::stoi(m[2]), std::stoi(m[3]));  // prefix rank = RANK
      EXPECT_EQ(std::stoi(m[3]) / 2, i);            // node i holds ranks 2i, 2i+1
      ranks.insert(std::stoi(m[3]));
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4, 5}));
}

TEST_F(NetnsTest, KillingOneAgentStopsTheOthersWithinTheHeartbeatBound) {
  const std::vector<std::string> flags = {"--monitor-interval", "100ms", "--heartbeat-misses", "5"};
  for (int i = 0; i < 3; ++i) start_node(i, flags, {"sleep"}, {"LAUNCH_TEST_MARKER=" + dir_});
  // All six workers run before the kill.
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::pids_with_env("LAUNCH_TEST_MARKER=" + dir_).size() >= 9; }, 30s));
  const auto killed_at = std::chrono::steady_clock::now();
  nodes_[2]->signal(SIGKILL);
  for (int i : {0, 1}) {
    EXPECT_EQ(nodes_[static_cast<size_t>(i)]->wait(30s), 1)
        << nodes_[static_cast<size_t>(i)]->err();
    EXPECT_NE(nodes_[static_cast<size_t>(i)]->err().find("node lost"), std::string::npos);
  }
  const auto took = std::chrono::steady_clock::now() - killed_at;
  std::printf("other nodes stopped %.3f s after kill -9 of node 2's agent\n",
              std::chrono::duration<double>(took).count());
  // Heartbeat bound (100 ms x 5) plus the failure grace (500 ms) and process exit.
  EXPECT_LT(took, 3s);
  EXPECT_TRUE(testing::wait_until(
      [&] { return testing::pids_with_env("LAUNCH_TEST_MARKER=" + dir_).empty(); }, 10s));
}

TEST_F(NetnsTest, CutLinkIsDetectedWithinIntervalTimesMisses) {
  // The cut node stops its workers within the bound, then waits --rdzv-connect-timeout for
  // the link to come back before it gives up.
  const std::vector<std::string> flags = {
      "--monitor-interval", "100ms", "--heartbeat-misses", "5", "--rdzv-connect-timeout", "2s"};
  for (int i = 0; i < 3; ++i) start_node(i, flags, {"sleep"}, {"LAUNCH_TEST_MARKER=" + dir_});
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::pids_with_env("LAUNCH_TEST_MARKER=" + dir_).size() >= 9; }, 30s));
  cluster_->cut(2);
  for (int i : {0, 1}) {
    EXPECT_EQ(nodes_[static_cast<size_t>(i)]->wait(30s), 1)
        << nodes_[static_cast<size_t>(i)]->err();
    EXPECT_NE(nodes_[static_cast<size_t>(i)]->err().find("no heartbeat"), std::string::npos)
        << nodes_[static_cast<size_t>(i)]->err();
  }
  // The cut-off node loses the server the same way and stops its own workers.
  EXPECT_EQ(nodes_[2]->wait(30s), 69) << nodes_[2]->err();
  EXPECT_TRUE(testing::wait_until(
      [&] { return testing::pids_with_env("LAUNCH_TEST_MARKER=" + dir_).empty(); }, 10s));
}

TEST_F(NetnsTest, ClientWithoutTheTokenIsRefused) {
  ChildProcess& host = start_node(0, {"--rdzv-timeout", "20s"}, {"sleep"});
  const std::string wrong =
      write_token_file(dir_ + "/..", "wrong-token-" + std::to_string(getpid()));
  std::vector<std::string> argv{"ip",
                                "netns",
                                "exec",
                                cluster_->ns(1),
                                kRun,
                                "--nnodes",
                                "3",
                                "--rdzv-endpoint",
                                NetnsCluster::addr(0) + ":" + std::to_string(kPort),
                                "--rdzv-token-file",
                                wrong,
                                "--rdzv-connect-timeout",
                                "10s",
                                kWorker,
                                "sleep"};
  ChildProcess intruder(argv, {}, dir_ + "/intruder");
  EXPECT_EQ(intruder.wait(30s), 77) << intruder.err();
  EXPECT_NE(intruder.err().find("UNAUTHENTICATED"), std::string::npos) << intruder.err();
  host.signal(SIGTERM);
  host.wait(30s);
  std::remove(wrong.c_str());
}

TEST_F(NetnsTest, ServerBoundToOneAddressIsUnreachableAtOthers) {
  // Node 0 has a second address; the server binds only the first.
  ASSERT_EQ(sh("ip -n " + cluster_->ns(0) + " addr add 10.77.1.11/24 dev eth0"), 0);
  const std::string endpoint = NetnsCluster::addr(0) + ":" + std::to_string(kPort);
  ChildProcess server({"ip", "netns", "exec", cluster_->ns(0), kRun, "--rdzv-server", "--nnodes",
                       "2", "--rdzv-endpoint", endpoint, "--rdzv-token-file", token_file_},
                      {}, dir_ + "/server");
  auto client = [&](int node, const std::string& ep, const std::string& tag) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{"ip", "netns", "exec", cluster_->ns(node), kRun, "--nnodes", "2",
                                 "--rdzv-endpoint", ep, "--rdzv-token-file", token_file_,
                                 "--rdzv-connect-timeout", "1s", "--log-dir", dir_ + "/" + tag,
                                 kWorker, "env"},
        std::vector<std::string>{}, dir_ + "/" + tag);
  };
  auto other_addr = client(1, "10.77.1.11:" + std::to_string(kPort), "other");
  EXPECT_EQ(other_addr->wait(30s), 69) << other_addr->err();
  EXPECT_NE(other_addr->err().find("10.77.1.11:" + std::to_string(kPort)), std::string::npos);
  // At the bound address the same job forms (two nodes) and succeeds.
  auto a = client(1, endpoint, "a");
  auto b = client(2, endpoint, "b");
  EXPECT_EQ(a->wait(60s), 0) << a->err();
  EXPECT_EQ(b->wait(60s), 0) << b->err();
  EXPECT_EQ(server.wait(30s), 0) << server.err();
}

// "attempt A world W rank R" lines of one node's output.
std::vector<std::array<int, 3>> attempts(const std::string& out) {
  std::vector<std::array<int, 3>> seen;
  std::istringstream in(out);
  std::string line;
  const std::regex re(R"(^\[\d+:\d+\] attempt (\d+) world (\d+) rank (\d+)$)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, re))
      seen.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3])});
  }
  return seen;
}

TEST_F(NetnsTest, FailureOnOneNodeRestartsTheWholeJob) {
  for (int i = 0; i < 3; ++i) start_node(i, {"--max-restarts", "1"}, {"first-attempt-fails", "3"});
  std::set<int> ranks;
  for (int i = 0; i < 3; ++i) {
    auto& node = *nodes_[static_cast<size_t>(i)];
    ASSERT_EQ(node.wait(60s), 0) << node.err();
    for (auto [attempt, world, rank] : attempts(node.out())) {
      EXPECT_EQ(attempt, 1);
      EXPECT_EQ(world, 6);
      ranks.insert(rank);
    }
    struct stat st {};
    EXPECT_EQ(stat((dir_ + "/node" + std::to_string(i) + "/attempt_1").c_str(), &st), 0);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4, 5}));
}

TEST_F(NetnsTest, ElasticJobContinuesWithTheNodesLeft) {
  const std::vector<std::string> flags = {
      "--nnodes", "2:3", "--max-restarts", "1", "--last-call-timeout", "300ms"};
  for (int i = 0; i < 3; ++i)
    start_node(i, flags, {"first-attempt-fails", "-1"}, {"LAUNCH_TEST_MARKER=" + dir_});
  ASSERT_TRUE(testing::wait_until(
      [&] { return testing::pids_with_env("LAUNCH_TEST_MARKER=" + dir_).size() >= 9; }, 30s));
  nodes_[2]->signal(SIGKILL);
  std::set<int> ranks;
  for (int i : {0, 1}) {
    auto& node = *nodes_[static_cast<size_t>(i)];
    ASSERT_EQ(node.wait(60s), 0) << node.err();
    for (auto [attempt, world, rank] : attempts(node.out())) {
      EXPECT_EQ(attempt, 1);
      EXPECT_EQ(world, 4);  // two nodes of two workers are left
      ranks.insert(rank);
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
}

// docs/launching.md's multi-node commands, as written, on hosts whose name maps to 127.0.1.1:
// Gloo must not bind loopback (it binds the interface that reaches the rendezvous).
TEST_F(NetnsTest, DocsCommandsWorkOnHostsWhoseNameMapsToLoopback) {
  if (std::system("command -v unshare >/dev/null 2>&1") != 0) GTEST_SKIP() << "no unshare(1)";
  for (int i = 0; i < 3; ++i) start_docs_node(i, {"all_reduce"});
  std::set<int> ranks;
  const std::regex re(R"(^\[(\d):(\d)\] all_reduce rank (\d) of 6 sum 21$)");
  for (int i = 0; i < 3; ++i) {
    auto& node = *nodes_[static_cast<size_t>(i)];
    ASSERT_EQ(node.wait(60s), 0) << node.err();
    std::istringstream in(node.out());
    std::smatch m;
    for (std::string line; std::getline(in, line);) {
      ASSERT_TRUE(std::regex_match(line, m, re)) << line;
      ranks.insert(std::stoi(m[3]));
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4, 5}));
}

// A 1.5 s link blip on one node, longer than the heartbeat bound (100 ms x 5): the round is
// lost, the cut node gives its workers up and joins again when the link is back, and the job
// restarts (attempt 1) and succeeds; never a wait for --rdzv-timeout.
TEST_F(NetnsTest, LinkBlipEndsInARestartNotARendezvousTimeout) {
  for (const auto& seen : blip_node_two(1500ms, 3)) {
    EXPECT_FALSE(seen.empty());
    for (auto [attempt, world, rank] : seen) EXPECT_GE(attempt, 1);
  }
  EXPECT_NE(nodes_[2]->err().find("joining the job again"), std::string::npos) << nodes_[2]->err();
}

// A 5 s blip (longer than TCP's first retransmission timeouts) costs exactly one restart: the
// node that comes back must not miss the next round's first heartbeat bound (with
// --max-restarts 1 a second restart would fail the job).
TEST_F(NetnsTest, FiveSecondLinkBlipCostsOneRestart) {
  for (const auto& seen : blip_node_two(5s, 1)) {
    EXPECT_FALSE(seen.empty());
    for (auto [attempt, world, rank] : seen) EXPECT_EQ(attempt, 1);
  }
}

// The node serving the rendezvous is stopped (SIGSTOP) for 3 s: the others notice within the
// heartbeat bound and stop their workers; when it runs again the job restarts and succeeds,
// and the root cause names the server, not the first node whose heartbeat looked late.
TEST_F(NetnsTest, StoppedServerNodeIsNoticedWithinTheBoundAndTheJobRecovers) {
  const std::vector<std::string> flags = {"--max-restarts", "3", "--rdzv-timeout", "60s"};
  for (int i = 0; i < 3; ++i) {
    start_node(i, flags, {"first-attempt-fails", "-1"},
               {"LAUNCH_TEST_MARKER=" + dir_ + "/n" + std::to_string(i)});
  }
  ASSERT_TRUE(testing::wait_until(
      [&] { return processes_of(0) >= 4 && processes_of(1) >= 4 && processes_of(2) >= 4; }, 30s));
  nodes_[0]->signal(SIGSTOP);
  const auto stopped_at = std::chrono::steady_clock::now();
  // Nodes 1 and 2 keep only their agents (and each agent's orphan guard).
  ASSERT_TRUE(
      testing::wait_until([&] { return processes_of(1) <= 2 && processes_of(2) <= 2; }, 20s));
  const double noticed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  std::printf(
      "workers of the other nodes stopped %.3f s after the server node's agent was stopped\n",
      noticed);
  const auto resume_at = stopped_at + 3s;
  std::this_thread::sleep_until(resume_at);
  nodes_[0]->signal(SIGCONT);
  for (int i = 0; i < 3; ++i) {
    auto& node = *nodes_[static_cast<size_t>(i)];
    ASSERT_EQ(node.wait(60s), 0) << node.err();
    EXPECT_FALSE(attempts(node.out()).empty()) << node.out();
  }
  EXPECT_NE(nodes_[1]->err().find("rendezvous server"), std::string::npos) << nodes_[1]->err();
  EXPECT_EQ(nodes_[1]->err().find("lost the rendezvous server"), std::string::npos)
      << nodes_[1]->err();
}

// A node whose agent is stopped for 3 s says so when it runs again (not "lost the rendezvous
// server"), and rejoins: the job restarts and succeeds.
TEST_F(NetnsTest, StoppedNodeSaysItWasStoppedAndRejoins) {
  const std::vector<std::string> flags = {"--max-restarts", "3", "--rdzv-timeout", "60s"};
  for (int i = 0; i < 3; ++i) {
    start_node(i, flags, {"first-attempt-fails", "-1"},
               {"LAUNCH_TEST_MARKER=" + dir_ + "/n" + std::to_string(i)});
  }
  ASSERT_TRUE(testing::wait_until(
      [&] { return processes_of(0) >= 4 && processes_of(1) >= 4 && processes_of(2) >= 4; }, 30s));
  nodes_[2]->signal(SIGSTOP);
  std::this_thread::sleep_for(3s);
  nodes_[2]->signal(SIGCONT);
  for (int i = 0; i < 3; ++i) {
    auto& node = *nodes_[static_cast<size_t>(i)];
    ASSERT_EQ(node.wait(60s), 0) << node.err();
  }
  EXPECT_NE(nodes_[2]->err().find("this node did not run for"), std::string::npos)
      << nodes_[2]->err();
  EXPECT_EQ(nodes_[2]->err().find("lost the rendezvous server"), std::string::npos)
      << nodes_[2]->err();
}

}  // namespace
}  // namespace tessel::launcher
