#pragma once
// An agent's connection to the rendezvous server: blocking calls with deadlines, the job token
// on every call, and gRPC failures turned into RpcError carrying the status code.
//
// Thread-safe: one client may be used from the agent's threads at once (gRPC stubs are).

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "tessel/base/error.h"
#include "tessel/launcher/proto/rendezvous.grpc.pb.h"
#include "tessel/store/store_tls.h"

namespace tessel::launcher {

// A failed RPC: the gRPC status code and its message, with the endpoint.
class RpcError : public CommError {
 public:
  RpcError(const std::string& message, grpc::StatusCode code) : CommError(message), code_(code) {}
  grpc::StatusCode code() const { return code_; }

 private:
  grpc::StatusCode code_;
};

struct RendezvousClientOptions {
  // Own TCP connection per client (no subchannel sharing between channels in one process);
  // the benchmark sets it to simulate many agents from one process.
  bool private_connection = false;
  TlsFiles tls;  // TLS when tls.ca or tls.cert is set
};

// Channel arguments for the control plane: small TCP read buffers and no BDP probing, so a
// server with thousands of agent connections (and a process simulating thousands of agents)
// stays within memory; `private_connection` as in RendezvousClientOptions.
grpc::ChannelArguments control_plane_channel_args(bool private_connection);

class RendezvousClient {
 public:
  RendezvousClient(std::string endpoint, std::string token, RendezvousClientOptions options = {});

  const std::string& endpoint() const { return endpoint_; }

  // Connects and makes one call with the token (Ping), retrying with exponential backoff
  // (100 ms doubling to 2 s) until `timeout`. Throws Unavailable naming the endpoint and the
  // attempts when it never answers, RpcError (UNAUTHENTICATED) when it refuses the token.
  void wait_connected(std::chrono::milliseconds timeout);
  // One Ping. Throws RpcError.
  proto::PingResponse ping(const std::string& node_id, std::chrono::milliseconds timeout);

  // Joins the next round; blocks until it forms or `timeout`. Throws RpcError
  // (DEADLINE_EXCEEDED when the round did not form, UNAUTHENTICATED without the right token).
  // `context`, when given, lets another thread cancel the wait.
  proto::JoinResponse join(const proto::JoinRequest& request, std::chrono::milliseconds timeout,
                           grpc::ClientContext* context = nullptr);
  // One heartbeat. Throws RpcError (FAILED_PRECONDITION when the round is stale).
  proto::HeartbeatResponse heartbeat(const std::string& node_id, int64_t round,
                                     std::chrono::milliseconds timeout);
  // Reports a failure; true when it became the round's root cause. Throws RpcError.
  bool report_failure(const std::string& node_id, int64_t round, const proto::Failure& failure,
                      std::chrono::milliseconds timeout);
  void report_done(const std::string& node_id, int64_t round, std::chrono::milliseconds timeout);
  // Long-poll for the next event after `round`. `context` lets another thread cancel it.
  // Throws RpcError.
  proto::JobEvent wait_event(const std::string& node_id, int64_t round,
                             std::chrono::milliseconds timeout, grpc::ClientContext* context);

 private:
  void prepare(grpc::ClientContext& context, std::chrono::milliseconds timeout) const;
  [[noreturn]] void fail(const char* what, const grpc::Status& status) const;

  std::string endpoint_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Rendezvous::Stub> stub_;
};

}  // namespace tessel::launcher
