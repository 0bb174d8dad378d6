// The closed loop on the rendezvous server (docs/launching.md#recovery): which failures take a
// node out of the job, that it is refused for the job's life, that the next round forms
// without it, and that a job left with fewer than --nnodes MIN fails saying why.
#include <gtest/gtest.h>
#include <signal.h>

#include "rendezvous_test_util.h"
#include "tessel/launcher/hang_dump.h"
#include "tessel/launcher/rendezvous_client.h"
#include "tessel/launcher/rendezvous_server.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using proto::JobEvent;

constexpr const char* kToken = testing::kRendezvousTestToken;
using testing::join_all;

RendezvousServerOptions options(int min_nodes, int max_nodes, bool exclude = true) {
  RendezvousServerOptions o;
  o.bind_address = "127.0.0.1:0";
  o.token = kToken;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.max_restarts = 3;
  o.heartbeat_interval = 1s;  // no heartbeats are sent here: nobody is lost by silence
  o.heartbeat_misses = 30;
  o.last_call_timeout = 100ms;
  o.poll_limit = 5s;
  o.exclude_culprits = exclude;
  return o;
}

// Node i: host h<i>, address 10.0.0.<i+1>, two workers (ranks 2i, 2i+1 in a full round).
proto::JoinRequest node(int i, const std::string& id_suffix = "") {
  proto::JoinRequest r;
  r.set_node_id("n" + std::to_string(i) + id_suffix);
  r.set_host("h" + std::to_string(i));
  r.set_addr("10.0.0." + std::to_string(i + 1));
  r.set_nproc(2);
  r.set_requested_rank(i);
  r.set_master_port(2000);
  return r;
}

proto::Failure worker_failure(int rank, int exit_code, int signal) {
  proto::Failure f;
  f.set_rank(rank);
  f.set_exit_code(exit_code);
  f.set_signal(signal);
  f.set_reason(signal != 0 ? "signal" : "exited");
  return f;
}

// Round 0 with nodes 0..2; node REPORTER reports F; returns the event node WAITER sees.
JobEvent fail_round_zero(RendezvousServer& server, const proto::Failure& f,
                         const std::string& reporter = "n2", const std::string& waiter = "n0") {
  join_all(server.address(), {node(0), node(1), node(2)});
  RendezvousClient client(server.address(), kToken);
  client.report_failure(reporter, 0, f, 5s);
  grpc::ClientContext ctx;
  return client.wait_event(waiter, 0, 20s, &ctx);
}

TEST(ExclusionTest, CrashedWorkerTakesItsNodeOutAndTheNextRoundFormsWithoutIt) {
  RendezvousServer server(options(2, 3));
  const JobEvent e = fail_round_zero(server, worker_failure(5, 0, SIGSEGV));
  ASSERT_EQ(e.kind(), JobEvent::RESTART);
  ASSERT_EQ(e.root_cause().excluded_size(), 1);
  const proto::Exclusion& x = e.root_cause().excluded(0);
  EXPECT_EQ(x.host(), "h2");
  EXPECT_EQ(x.addr(), "10.0.0.3");
  EXPECT_EQ(x.group_rank(), 2);
  EXPECT_EQ(std::vector<int>(x.ranks().begin(), x.ranks().end()), std::vector<int>{5});
  EXPECT_NE(x.reason().find("SIGSEGV"), std::string::npos) << x.reason();
  // The node's agent (or a new agent on that node: another node id) is refused for good.
  RendezvousClient client(server.address(), kToken);
  try {
    client.join(node(2, "-restarted"), 5s);
    FAIL() << "an excluded node joined again";
  } catch (const RpcError& err) {
    EXPECT_EQ(err.code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(err.message().find("taken out of the job after round 0"), std::string::npos)
        << err.message();
  }
  const auto r = join_all(server.address(), {node(0), node(1)});
  EXPECT_EQ(r[0].round(), 1);
  EXPECT_EQ(r[0].group_world_size(), 2);
  EXPECT_EQ(r[0].world_size(), 4);
  EXPECT_EQ(server.excluded().size(), 1u);
}

// Several agents of the job on one machine (a test, or a user running two agents per host):
// the culprit agent is taken out, not the machine under its healthy neighbours; the machine
// goes when the culprit is the only agent on it.
TEST(ExclusionTest, OnASharedMachineOnlyTheCulpritAgentIsTakenOut) {
  RendezvousServer server(options(1, 3));
  proto::JoinRequest n0 = node(0), n1 = node(1), n2 = node(2);
  n1.set_host("h0");
  n1.set_addr(n0.addr());  // nodes 0 and 1 share a machine; node 2 has one of its own
  join_all(server.address(), {n0, n1, n2});
  RendezvousClient client(server.address(), kToken);
  client.report_failure("n1", 0, worker_failure(3, 0, SIGSEGV), 5s);
  grpc::ClientContext ctx;
  const JobEvent e = client.wait_event("n0", 0, 20s, &ctx);
  ASSERT_EQ(e.kind(), JobEvent::RESTART);
  ASSERT_EQ(e.root_cause().excluded_size(), 1);
  EXPECT_EQ(e.root_cause().excluded(0).node_id(), "n1");
  // Node 0, on the same machine, forms the next round with node 2; node 1's agent is refused.
  try {
    client.join(n1, 5s);
    FAIL() << "the excluded agent joined again";
  } catch (const RpcError& err) {
    EXPECT_EQ(err.code(), grpc::StatusCode::PERMISSION_DENIED) << err.message();
  }
  const auto r = join_all(server.address(), {n0, n2});
  EXPECT_EQ(r[0].round(), 1);
  EXPECT_EQ(r[0].group_world_size(), 2);
  // Node 2 alone on its machine: a crash there takes the machine out (any agent on it).
  client.report_failure("n2", 1, worker_failure(3, 0, SIGSEGV), 5s);
  grpc::ClientContext ctx2;
  const JobEvent e2 = client.wait_event("n0", 1, 20s, &ctx2);
  ASSERT_EQ(e2.kind(), JobEvent::RESTART);
  ASSERT_EQ(e2.root_cause().excluded_size(), 1);
  EXPECT_EQ(e2.root_cause().excluded(0).host(), "h2");
  EXPECT_TRUE(e2.root_cause().excluded(0).node_id().empty());
  try {
    client.join(node(2, "-restarted"), 5s);
    FAIL() << "a new agent on the excluded machine joined";
  } catch (const RpcError& err) {
    EXPECT_EQ(err.code(), grpc::StatusCode::PERMISSION_DENIED) << err.message();
  }
}

TEST(ExclusionTest, AProgramErrorExitCodeTakesNobodyOut) {
  RendezvousServer server(options(2, 3));
  const JobEvent e = fail_round_zero(server, worker_failure(5, 1, 0));
  ASSERT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(e.root_cause().excluded_size(), 0);
  const auto r = join_all(server.address(), {node(0), node(1), node(2)});
  EXPECT_EQ(r[0].group_world_size(), 3);
}

TEST(ExclusionTest, OffKeepsEveryNode) {
  RendezvousServer server(options(2, 3, /*exclude=*/false));
  const JobEvent e = fail_round_zero(server, worker_failure(5, 0, SIGSEGV));
  ASSERT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(e.root_cause().excluded_size(), 0);
  EXPECT_TRUE(server.excluded().empty());
}

// The hang path: the first report is a victim (rank 1 timed out); the verdict decides.
JobEvent hang_with_verdict(RendezvousServer& server) {
  proto::Failure victim = worker_failure(1, kCollectiveTimeoutExitCode, 0);
  victim.set_hang(true);
  return fail_round_zero(server, victim, "n0", "n1");
}

TEST(ExclusionTest, AVerdictNamingAHungRankTakesItsNodeOut) {
  auto o = options(2, 3);
  o.on_hang = [](const proto::Failure&, int64_t, int) -> std::optional<proto::Failure> {
    proto::Failure f;
    f.set_hang(true);
    f.set_rank(4);
    f.add_culprits(4);
    f.set_exit_code(kCollectiveTimeoutExitCode);
    f.set_verdict("CULPRIT FOUND: rank 4");
    f.set_reason("hung: before all_reduce #7");
    return f;
  };
  RendezvousServer server(o);
  const JobEvent e = hang_with_verdict(server);
  ASSERT_EQ(e.kind(), JobEvent::RESTART);
  // The verdict's culprit is named with its node, though node 0 reported the failure.
  EXPECT_EQ(e.root_cause().rank(), 4);
  EXPECT_EQ(e.root_cause().addr(), "10.0.0.3");
  EXPECT_EQ(e.root_cause().group_rank(), 2);
  ASSERT_EQ(e.root_cause().excluded_size(), 1);
  EXPECT_EQ(e.root_cause().excluded(0).addr(), "10.0.0.3");
}

TEST(ExclusionTest, AnInconclusiveVerdictRestartsWithoutExclusion) {
  auto o = options(2, 3);
  o.on_hang = [](const proto::Failure& reported, int64_t, int) -> std::optional<proto::Failure> {
    proto::Failure f = reported;  // names nobody: the workers' first failure stays the cause
    f.set_verdict("INCONCLUSIVE: ranks disagree");
    return f;
  };
  RendezvousServer server(o);
  const JobEvent e = hang_with_verdict(server);
  ASSERT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(e.root_cause().excluded_size(), 0);
}

TEST(ExclusionTest, ExclusionBelowTheMinimumFailsTheJobSayingWhy) {
  RendezvousServer server(options(3, 3));
  const JobEvent e = fail_round_zero(server, worker_failure(4, 0, SIGBUS));
  ASSERT_EQ(e.kind(), JobEvent::FAILED);
  EXPECT_EQ(e.root_cause().excluded_size(), 1);
  EXPECT_NE(e.root_cause().outcome_note().find("leaves 2 nodes of the round's 3, fewer than the "
                                               "--nnodes minimum 3"),
            std::string::npos)
      << e.root_cause().outcome_note();
}

// A program that says its configuration cannot work in this world (exit 65: train_gpt's
// --dp-shard 3 once the job shrank to 4 ranks) ends the job at once: no restart is burnt.
TEST(ExclusionTest, AConfigurationThatCannotWorkEndsTheJobWithoutRestarts) {
  RendezvousServer server(options(2, 3));
  const JobEvent e = fail_round_zero(server, worker_failure(0, 65, 0));
  ASSERT_EQ(e.kind(), JobEvent::FAILED);
  EXPECT_EQ(e.restart_count(), 0);
  EXPECT_NE(e.root_cause().outcome_note().find("cannot work with 6 ranks on 3 nodes"),
            std::string::npos)
      << e.root_cause().outcome_note();
}

}  // namespace
}  // namespace tessel::launcher
