#pragma once
// ConnectionGate: the listening socket of a gRPC server, accepted by tessel instead of gRPC so
// that connections are counted per peer address before gRPC spends memory on them. Internal to
// store/internal and the launcher (which serves rendezvous and the store from one server).
//
//   ConnectionGate gate("10.0.0.1:29400", ConnectionLimits{});   // binds and listens now
//   grpc::ServerBuilder builder;
//   gate.attach(builder, credentials);                          // before BuildAndStart
//   auto server = builder.BuildAndStart();
//   gate.start();                                               // accepting from here on
//   ...   // handlers call gate.authenticated(ctx->peer()) for calls that carried the token
//   gate.stop();                                                // before server->Shutdown
//
// A connection is unauthenticated until a call on it carried the job's token (the token is
// checked on the call's headers, before its body is read: server_auth.h). Unauthenticated
// connections are limited per peer address and in all; past a limit the oldest one of that
// peer is closed when it has had `eviction_age` to authenticate, otherwise the new one is
// refused at once. Authenticated connections are never limited here: a job's own agents and
// workers keep their connections whatever a stranger on the same host does.
//
// Thread-safe. Owns the listening socket, one duplicate descriptor per accepted connection (to
// see it close and to close it), and one thread (accept loop), joined by stop().

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "tessel/base/mutex.h"

namespace tessel::internal {

struct ConnectionLimits {
  size_t max_unauthenticated_per_peer = 64;      // from one address, before their first good call
  size_t max_unauthenticated = 1024;             // from all addresses
  size_t max_connections = 0;                    // in all; 0: what RLIMIT_NOFILE leaves room for
  std::chrono::milliseconds eviction_age{1000};  // an unauthenticated connection this old may
                                                 // be closed to make room for a newer one
  std::chrono::milliseconds auth_timeout{std::chrono::seconds(30)};  // closed unauthenticated
};

struct ConnectionGateStats {
  size_t connections = 0;      // open now
  size_t unauthenticated = 0;  // open now, no good call yet
  size_t accepted = 0;         // since start
  size_t refused = 0;          // closed at accept (a limit)
  size_t evicted = 0;          // closed later (unauthenticated, to make room or timed out)
};

class ConnectionGate {
 public:
  // Binds and listens on `address` ("host:port"; port 0 picks one; "[::1]:0" for IPv6). Only
  // that address: never all interfaces unless it is 0.0.0.0/[::]. Throws IoError naming the
  // address when it cannot be bound, InvalidArgument when it is not host:port.
  ConnectionGate(const std::string& address, ConnectionLimits limits);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  int port() const { return port_; }

  // Registers the gate as the server's source of connections, with `credentials` (which check
  // the token on every call's headers). Call once, before builder.BuildAndStart().
  void attach(grpc::ServerBuilder& builder, std::shared_ptr<grpc::ServerCredentials> credentials);
  // Starts the accept thread. Call after the server started.
  void start();
  // Stops accepting and joins the thread; open connections are left to the server's shutdown.
  // Idempotent.
  void stop();

  // A call carrying the job's token arrived from `peer` (gRPC's "ipv4:10.0.0.2:51234"). Cheap;
  // called by every handler. Unknown peers (in-process calls) are ignored.
  void authenticated(std::string_view peer);

  ConnectionGateStats stats() const;

 private:
  struct Connection;
  struct Peer {
    size_t unauthenticated = 0;
  };
  void run();
  void accept_ready();
  void drop_locked(int dup_fd, bool shut_down) TESSEL_REQUIRES(mutex_);
  bool make_room_locked(const std::string& host) TESSEL_REQUIRES(mutex_);
  void sweep_locked() TESSEL_REQUIRES(mutex_);

  ConnectionLimits limits_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  mutable Mutex mutex_;
  // The open connections by our duplicate fd and by gRPC's peer string; counts per peer address.
  std::unordered_map<int, std::unique_ptr<Connection>> by_fd_ TESSEL_GUARDED_BY(mutex_);
  std::unordered_map<std::string, Connection*> by_peer_ TESSEL_GUARDED_BY(mutex_);
  std::unordered_map<std::string, Peer> peers_ TESSEL_GUARDED_BY(mutex_);
  ConnectionGateStats stats_ TESSEL_GUARDED_BY(mutex_);
  std::thread thread_;
  bool stopped_ TESSEL_GUARDED_BY(mutex_) = false;
};

}  // namespace tessel::internal
