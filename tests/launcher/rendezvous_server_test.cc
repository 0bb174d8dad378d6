#include "tessel/launcher/rendezvous_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>
#include <tuple>

#include "child_process.h"
#include "rendezvous_test_util.h"
#include "tessel/launcher/rendezvous_client.h"

namespace tessel::launcher {
namespace {

using namespace std::chrono_literals;
using proto::JobEvent;

constexpr const char* kToken = testing::kRendezvousTestToken;

RendezvousServerOptions options(int min_nodes, int max_nodes, int max_restarts = 0) {
  RendezvousServerOptions o;
  o.bind_address = "127.0.0.1:0";
  o.token = kToken;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.max_restarts = max_restarts;
  o.heartbeat_interval = 50ms;
  o.heartbeat_misses = 4;
  o.last_call_timeout = 200ms;
  o.poll_limit = 2s;
  return o;
}

proto::JoinRequest join_request(const std::string& id, const std::string& host, int nproc,
                                int requested_rank = -1) {
  proto::JoinRequest r;
  r.set_node_id(id);
  r.set_host(host);
  r.set_nproc(nproc);
  r.set_requested_rank(requested_rank);
  r.set_master_port(1000 + nproc);
  return r;
}

using testing::join_all;

class RendezvousRankOrderTest : public ::testing::TestWithParam<int> {};

// Ranks follow (requested rank first, then host, then node id); computed here independently.
TEST_P(RendezvousRankOrderTest, AssignsDocumentedDeterministicOrder) {
  const int n = GetParam();
  RendezvousServer server(options(n, n));
  std::vector<proto::JoinRequest> reqs;
  const std::vector<std::string> hosts = {"delta", "alpha", "charlie", "bravo", "echo"};
  for (int i = 0; i < n; ++i) {
    reqs.push_back(join_request("node" + std::to_string(i), hosts[static_cast<size_t>(i) % 5],
                                i + 1, i == n - 1 && n > 1 ? 0 : -1));
  }
  std::vector<size_t> order(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    auto key = [&](size_t i) {
      const int r = reqs[i].requested_rank();
      return std::make_tuple(r < 0, r, reqs[i].host(), reqs[i].node_id());
    };
    return key(a) < key(b);
  });
  const auto resp = join_all(server.address(), reqs);
  int offset = 0, world = 0;
  for (auto& r : reqs) world += r.nproc();
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const auto& r = resp[order[pos]];
    EXPECT_EQ(r.group_rank(), static_cast<int>(pos));
    EXPECT_EQ(r.group_world_size(), n);
    EXPECT_EQ(r.world_size(), world);
    EXPECT_EQ(r.rank_offset(), offset);
    EXPECT_EQ(r.round(), 0);
    EXPECT_EQ(r.master_addr(), "127.0.0.1");
    EXPECT_EQ(r.master_port(), 1000 + reqs[order[0]].nproc());
    offset += reqs[order[pos]].nproc();
  }
}
INSTANTIATE_TEST_SUITE_P(Nodes, RendezvousRankOrderTest, ::testing::Values(1, 2, 3, 5));

TEST(RendezvousServerTest, RefusesCallsWithoutTheToken) {
  RendezvousServer server(options(1, 1));
  RendezvousClient wrong(server.address(), "not-the-token");
  try {
    wrong.join(join_request("a", "h", 1), 5s);
    FAIL() << "join without the token succeeded";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  try {
    wrong.heartbeat("a", 0, 5s);
    FAIL() << "heartbeat without the token succeeded";
  } catch (const RpcError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST(RendezvousServerTest, FailureRestartsAndStaleWritesAreRefused) {
  RendezvousServer server(options(2, 2, /*max_restarts=*/1));
  auto r = join_all(server.address(), {join_request("a", "h1", 1), join_request("b", "h2", 1)});
  RendezvousClient client(server.address(), kToken);
  proto::Failure f;
  f.set_rank(0);
  f.set_exit_code(3);
  EXPECT_TRUE(client.report_failure("a", 0, f, 5s));
  grpc::ClientContext ctx;
  const JobEvent e = client.wait_event("b", 0, 5s, &ctx);
  EXPECT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(e.round(), 1);
  EXPECT_EQ(e.root_cause().node_id(), "a");
  EXPECT_EQ(e.root_cause().exit_code(), 3);
  // A second report of the old round is refused: a stale agent cannot touch round 1.
  try {
    client.report_failure("b", 0, f, 5s);
    FAIL() << "stale report accepted";
  } catch (const RpcError& err) {
    EXPECT_EQ(err.code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  EXPECT_THROW(client.heartbeat("a", 0, 5s), RpcError);
  EXPECT_EQ(server.current_round(), 1);
}

// A crash loop: every round fails at once. The server, not the agents, counts.
TEST(RendezvousServerTest, MaxRestartsHoldsAgainstCrashLoop) {
  for (int max_restarts : {0, 1, 3}) {
    RendezvousServer server(options(1, 1, max_restarts));
    RendezvousClient client(server.address(), kToken);
    int rounds = 0;
    JobEvent last;
    for (int attempt = 0; attempt < 10; ++attempt) {
      // A fresh node id each time, as a restarted agent process would have.
      proto::JoinResponse r;
      try {
        r = client.join(join_request("agent" + std::to_string(attempt), "h", 1), 5s);
      } catch (const RpcError& e) {
        EXPECT_EQ(e.code(), grpc::StatusCode::FAILED_PRECONDITION);
        break;
      }
      ++rounds;
      proto::Failure f;
      f.set_rank(0);
      f.set_exit_code(1);
      client.report_failure("agent" + std::to_string(attempt), r.round(), f, 5s);
      grpc::ClientContext ctx;
      last = client.wait_event("agent" + std::to_string(attempt), r.round(), 5s, &ctx);
      if (last.kind() == JobEvent::FAILED) break;
    }
    EXPECT_EQ(rounds, max_restarts + 1);
    EXPECT_EQ(last.kind(), JobEvent::FAILED);
    EXPECT_EQ(last.restart_count(), max_restarts);
  }
}

TEST(RendezvousServerTest, LostHeartbeatFailsTheRound) {
  auto o = options(2, 2, 1);
  RendezvousServer server(o);
  join_all(server.address(), {join_request("alive", "h1", 1), join_request("silent", "h2", 1)});
  RendezvousClient client(server.address(), kToken);
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    while (!stop) {
      try {
        client.heartbeat("alive", 0, 1s);
      } catch (const RpcError&) {
        return;  // round over
      }
      std::this_thread::sleep_for(o.heartbeat_interval);  // the heartbeat's own period
    }
  });
  grpc::ClientContext ctx;
  const JobEvent e = client.wait_event("alive", 0, 10s, &ctx);
  stop = true;
  beat.join();
  EXPECT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(e.root_cause().node_id(), "silent");
  EXPECT_EQ(e.root_cause().rank(), -1);
  EXPECT_NE(e.root_cause().reason().find("no heartbeat"), std::string::npos);
}

TEST(RendezvousServerTest, ElasticRoundFormsAfterLastCallWithMinNodes) {
  RendezvousServer server(options(2, 4));
  const auto r =
      join_all(server.address(), {join_request("a", "h1", 2), join_request("b", "h2", 2)});
  EXPECT_EQ(r[0].group_world_size(), 2);
  EXPECT_EQ(r[0].world_size(), 4);
}

TEST(RendezvousServerTest, SucceedsWhenEveryNodeIsDone) {
  RendezvousServer server(options(2, 2));
  join_all(server.address(), {join_request("a", "h1", 1), join_request("b", "h2", 1)});
  RendezvousClient client(server.address(), kToken);
  client.report_done("a", 0, 5s);
  EXPECT_EQ(server.wait_outcome(0ms).kind, JobEvent::NONE);
  client.report_done("b", 0, 5s);
  EXPECT_EQ(server.wait_outcome(5s).kind, JobEvent::SUCCEEDED);
  grpc::ClientContext ctx;
  EXPECT_EQ(client.wait_event("a", 0, 5s, &ctx).kind(), JobEvent::SUCCEEDED);
}

TEST(RendezvousServerTest, HangRunsTheDumpHookBeforeTheRoundEnds) {
  auto o = options(1, 1, 1);
  std::atomic<int> hook_calls{0};
  std::atomic<int> hook_world{0};
  o.on_hang = [&](const proto::Failure& root, int64_t round, int world) {
    EXPECT_TRUE(root.hang());
    EXPECT_EQ(round, 0);
    hook_world = world;
    ++hook_calls;
    return std::optional<proto::Failure>();
  };
  RendezvousServer server(o);
  RendezvousClient client(server.address(), kToken);
  client.join(join_request("a", "h", 3), 5s);
  proto::Failure f;
  f.set_rank(1);
  f.set_exit_code(124);
  f.set_hang(true);
  client.report_failure("a", 0, f, 5s);
  grpc::ClientContext ctx;
  const JobEvent e = client.wait_event("a", 0, 10s, &ctx);
  EXPECT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(hook_calls.load(), 1);  // ran before the event was sent
  EXPECT_EQ(hook_world.load(), 3);
}

TEST(RendezvousServerTest, BindsOnlyTheAddressItIsGiven) {
  RendezvousServer server(options(1, 1));
  // 127.0.0.2 is also loopback, but the server did not bind it.
  RendezvousClient other("127.0.0.2:" + std::to_string(server.port()), kToken);
  EXPECT_THROW(other.wait_connected(300ms), Unavailable);
  RendezvousClient same(server.address(), kToken);
  EXPECT_NO_THROW(same.wait_connected(5s));
}

TEST(RendezvousServerTest, SecondServerOnTheSamePortFails) {
  RendezvousServer server(options(1, 1));
  auto o = options(1, 1);
  o.bind_address = server.address();
  EXPECT_THROW(RendezvousServer second(o), CommError);
}

// An agent whose long-poll goes away (its process died, its connection closed) fails the round
// at once, without waiting for the heartbeat bound (an hour here).
TEST(RendezvousServerTest, ClosedLongPollFailsTheRoundAtOnce) {
  auto o = options(2, 2, 1);
  o.heartbeat_interval = std::chrono::hours(1);
  RendezvousServer server(o);
  join_all(server.address(), {join_request("a", "h1", 1), join_request("b", "h2", 1)});
  auto doomed = std::make_unique<RendezvousClient>(server.address(), kToken);
  grpc::ClientContext doomed_ctx;
  std::thread poll([&] { EXPECT_THROW(doomed->wait_event("b", 0, 30s, &doomed_ctx), RpcError); });
  RendezvousClient client(server.address(), kToken);
  // Once b's poll is parked, cancel it as a dying process's connection would.
  ASSERT_TRUE(testing::wait_until([&] { return server.parked_calls() == 1; }, 10s));
  doomed_ctx.TryCancel();
  poll.join();
  grpc::ClientContext ctx;
  const JobEvent e = client.wait_event("a", 0, 10s, &ctx);
  EXPECT_EQ(e.kind(), JobEvent::RESTART);
  EXPECT_EQ(e.root_cause().node_id(), "b");
}

}  // namespace
}  // namespace tessel::launcher
