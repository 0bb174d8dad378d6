#pragma once
// The job's rendezvous server: an asynchronous gRPC service (callback API; no thread per
// waiting node) that forms rounds of nodes, assigns ranks, watches heartbeats, takes failure
// reports, counts restarts and pushes job events to every agent by long-poll. The same
// grpc::Server hosts the job's Store service for the workers (store/internal/store_service.h).
//
// Rank order (documented in docs/launching.md): nodes of a round are sorted by
// (requested --node-rank, nodes without one last; then host name; then node id). GROUP_RANK is
// the position in that order; a node's global ranks follow those of the nodes before it.
//
// Rounds: round 0 forms when --nnodes MAX nodes joined, or MIN joined and the last-call timeout
// passed without more. A failure in a running round (the first report by the server's clock is
// the root cause) ends it: with restarts left the job moves to round + 1 and every agent
// rejoins; otherwise the job fails. Reports, heartbeats and completions naming an older round
// are refused (FAILED_PRECONDITION) so a stale agent cannot disturb a newer round.
//
// Thread-safety: all public methods are thread-safe. The server owns its grpc::Server and one
// monitor thread (heartbeat deadlines, last call, long-poll expiry), joined by stop().

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/launcher/proto/rendezvous.pb.h"
#include "tessel/store/store_tls.h"

namespace tessel::launcher {

struct RendezvousServerOptions {
  std::string bind_address;  // "HOST:PORT"; port 0 picks a free one. Only this address is bound.
  std::string token;         // required on every RPC (checked on its headers)
  TlsFiles tls;              // TLS when tls.cert is set; mutual TLS when tls.ca is set too
  int min_nodes = 1;
  int max_nodes = 1;
  int max_restarts = 0;
  std::chrono::milliseconds heartbeat_interval{100};
  int heartbeat_misses = 5;
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(1)};
  std::chrono::milliseconds poll_limit{std::chrono::seconds(10)};  // long-poll answer limit
  std::string host_name;    // this node's host name, for reports naming the server
  std::string master_addr;  // overrides group rank 0's address when set
  int master_port = 0;      // overrides group rank 0's free port when non-zero
  bool host_store = true;   // serve the job's Store (store/internal/store_service.h) too
  // Called on the monitor thread before a round that failed with a hang (or with dump_on_hang)
  // ends, while the workers still run: gathers flight-recorder dumps. May block (bounded).
  // Returns the root cause to report instead, when the workers' own failure times name another
  // rank than the first report did.
  std::function<std::optional<proto::Failure>(const proto::Failure& root_cause, int64_t round,
                                              int world_size)>
      on_hang;
  bool dump_on_hang = false;
  // The closed loop (docs/launching.md#recovery): when a round fails because of a node — a
  // flight-recorder verdict naming hung or crashed ranks, a worker killed by a fatal signal, a
  // node lost — that node (by host and address) is refused for the rest of the job. When fewer
  // than min_nodes would be left the job fails instead, saying why.
  bool exclude_culprits = false;
  // A standby taking the job over from a lost server: the job goes on at round FIRST_ROUND
  // (the lost server's round + 1) with RESTARTS_DONE counted (the loss included), EXCLUDED
  // refused, and TAKEOVER_CAUSE (the lost server's node) as the last round's root cause. When
  // RESTARTS_DONE exceeds max_restarts the job has failed: every join is told so.
  int64_t first_round = 0;
  int restarts_done = 0;
  std::vector<proto::Exclusion> excluded;
  std::optional<proto::Failure> takeover_cause;
};

// Final state of a job as the server saw it.
struct JobOutcome {
  proto::JobEvent::Kind kind = proto::JobEvent::NONE;  // NONE while running
  proto::Failure root_cause;
  int restart_count = 0;
};

class RendezvousServer {
 public:
  // Binds and starts serving. Throws CommError naming the address when it cannot be bound
  // (in use, not a local address).
  explicit RendezvousServer(RendezvousServerOptions options);
  ~RendezvousServer();  // stop()
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // "HOST:PORT" actually bound (the chosen port when 0 was asked).
  const std::string& address() const;
  int port() const;

  // Ends the job from this node (a signal here): every agent gets a STOP event with the given
  // cause. No effect once the job finished.
  void stop_job(const proto::Failure& cause);

  // The outcome once final (SUCCEEDED, FAILED, STOP), waiting up to `timeout`; NONE on timeout.
  JobOutcome wait_outcome(std::chrono::milliseconds timeout);
  // Waits until every node of the last round was told the final outcome, up to `timeout`.
  bool wait_all_notified(std::chrono::milliseconds timeout);
  int64_t current_round() const;
  // Calls the server holds open now (Joins waiting for a round, long-polls). For monitoring
  // and tests.
  size_t parked_calls() const;
  int restart_count() const;
  // Every node taken out of the job so far (exclude_culprits), oldest first.
  std::vector<proto::Exclusion> excluded() const;

  // Shuts the gRPC server down (pending calls are cancelled) and joins the monitor thread.
  void stop();

  class State;  // defined in rendezvous_server.cc

 private:
  std::unique_ptr<State> state_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::launcher
