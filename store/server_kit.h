#pragma once
// StoreServerKit: serve the job's Store from a gRPC server that also serves services of its own.
// tessel-run's rendezvous server does: one socket, one token, rendezvous and the store side by
// side. The kit owns what the two share:
//
//   - the listening socket and its connection gate (a connection is a stranger's until a call
//     on it carries the job's token; strangers are limited per address and in all),
//   - the server credentials that refuse a call without the token on its headers (and TLS),
//   - optionally the Store service itself, with the limits of StoreServerOptions.
//
//   StoreServerKit kit({.address = "10.0.0.5:29400", .token = token});
//   grpc::ServerBuilder builder;
//   kit.attach(builder);             // socket, credentials and (if hosted) the Store service
//   builder.RegisterService(&mine);  // the program's own services share socket and token
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   kit.start();                     // accept connections
//   // in each of the program's handlers, once the token checked out:
//   kit.authenticated(context->peer());
//   // shutting down:
//   kit.stop_accepting(); kit.stop_store(); server->Shutdown(deadline);
//
// Calls carry the token in the metadata key kJobTokenMetadataKey (the Store's own clients use
// another key, accepted too). Only in builds with gRPC (StoreServer::is_available()); this is
// the one header of the store that names gRPC types.

#include <grpcpp/security/credentials.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>
#include <string_view>

#include "tessel/store/store_server.h"
#include "tessel/store/store_tls.h"

namespace tessel {

// The metadata key of the job's token on calls to services co-hosted with the store.
inline constexpr std::string_view kJobTokenMetadataKey = "x-tessel-token";

struct StoreServerKitOptions {
  // host:port to listen on exactly; port 0 picks a free one (see port()).
  std::string address;
  // The job's token; required.
  std::string token;
  TlsFiles tls;
  // Serve the Store service too (false: only the program's own services).
  bool host_store = true;
  StoreLimits limits;
};

// Not copyable. attach() once, then start(); stop_accepting() and stop_store() are idempotent.
class StoreServerKit {
 public:
  // Binds and listens on options.address. Throws InvalidArgument for an empty token or an
  // address that is not host:port, IoError naming the address when it cannot be bound.
  explicit StoreServerKit(StoreServerKitOptions options);
  ~StoreServerKit();
  StoreServerKit(const StoreServerKit&) = delete;
  StoreServerKit& operator=(const StoreServerKit&) = delete;

  int port() const;
  bool hosts_store() const;

  // Gives `builder` the kit's socket and token credentials, and registers the Store service
  // (with its message-size limits) when hosted. Call before builder.BuildAndStart().
  void attach(grpc::ServerBuilder& builder);
  // Starts accepting connections. Call after the server started.
  void start();

  // A call with the job's token arrived from `peer` (gRPC's "ipv4:10.0.0.2:51234"): its
  // connection is no longer a stranger's. Cheap; unknown peers (in-process calls) are ignored.
  void authenticated(std::string_view peer);

  // Stops accepting connections (open ones are left to the server's shutdown).
  void stop_accepting();
  // Fails the Store's parked calls (clients see PeerLost: the server stopped) and refuses new
  // blocking calls. Call before shutting the grpc::Server down.
  void stop_store();

  StoreServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Channel credentials for a client of a kit's server: TLS when tls.ca or tls.cert is set,
// otherwise insecure (the token still guards every call).
std::shared_ptr<grpc::ChannelCredentials> client_channel_credentials(const TlsFiles& tls);

}  // namespace tessel
