#pragma once
// StoreService: the gRPC Store service (store.proto) over a StoreTable, on gRPC's callback API.
// Internal header for hosts of a gRPC server: StoreServer, and the launcher, which serves
// rendezvous and the store from one server:
//
//   internal::StoreService store(token, limits);
//   internal::ConnectionGate gate(address, connection_limits(limits));
//   grpc::ServerBuilder builder;
//   gate.attach(builder, internal::token_server_credentials(token, tls));
//   store.set_gate(&gate);
//   internal::add_store_service(builder, store);
//   builder.RegisterService(&rendezvous);
//   auto server = builder.BuildAndStart();
//   ...
//   store.stop();                                      // fail parked calls first
//   server->Shutdown(deadline);                        // then stop serving
//
// The service must outlive the grpc::Server it is registered on.

#include <grpcpp/server_builder.h>

#include <string>

#include "tessel/store/internal/connection_gate.h"
#include "tessel/store/internal/server_auth.h"
#include "tessel/store/internal/store.grpc.pb.h"
#include "tessel/store/internal/store_table.h"
#include "tessel/store/store_server.h"

namespace tessel::internal {

// The metadata entry that carries the job's token on every call.
inline constexpr const char* kStoreTokenMetadata = kStoreTokenKey;

// The gate limits a server's StoreLimits ask for.
ConnectionLimits connection_limits(const StoreLimits& limits);

// Thread-safe. Every call is checked against the token (constant-time comparison; the token is
// never logged); blocking calls park in the table and hold no thread. Owns the table and its
// deadline thread (started in the constructor, joined by stop() or the destructor).
class StoreService final : public storepb::Store::CallbackService {
 public:
  // Throws InvalidArgument for an empty token.
  StoreService(std::string token, StoreLimits limits);
  ~StoreService() override;

  // Fails parked calls (clients see PeerLost: the server stopped) and refuses new blocking
  // calls. Call before shutting the grpc::Server down. Idempotent.
  void stop();
  StoreServerStats stats() const { return table_.stats(); }
  const StoreLimits& limits() const { return table_.limits(); }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const storepb::SetRequest* request,
                                storepb::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const storepb::GetRequest* request,
                                storepb::GetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const storepb::AddRequest* request,
                                storepb::AddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const storepb::CompareSetRequest* request,
                                       storepb::CompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const storepb::CheckRequest* request,
                                  storepb::CheckResponse* response) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* context,
                                      const storepb::DeleteKeyRequest* request,
                                      storepb::DeleteKeyResponse* response) override;
  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* context,
                                     const storepb::MultiSetRequest* request,
                                     storepb::MultiSetResponse* response) override;

  // Tells `gate` (which must outlive the service) of every authorized network call.
  void set_gate(ConnectionGate* gate) { gate_ = gate; }

  // The request's token matches (constant time in the token's length). Network calls with a
  // wrong token were already refused on their headers; this covers in-process calls.
  bool authorized(const grpc::CallbackServerContext& context) const;
  StoreTable& table() { return table_; }

 private:
  const std::string token_;
  StoreTable table_;
  ConnectionGate* gate_ = nullptr;
};

// Registers service on builder with the settings it needs, which apply to the whole server:
// the largest request its limits allow and the keepalive policy StoreClient uses. (The socket
// is the ConnectionGate's, bound without SO_REUSEPORT: a taken port is an error.)
void add_store_service(grpc::ServerBuilder& builder, StoreService& service);

}  // namespace tessel::internal
