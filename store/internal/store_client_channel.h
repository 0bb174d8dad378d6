#pragma once
// The gRPC side of StoreClient: its Impl, so StoreServer::connect() can make a client over the
// server's in-process channel. Internal to store/internal.

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <shared_mutex>
#include <string>

#include "tessel/store/internal/store.grpc.pb.h"
#include "tessel/store/store_client.h"

namespace tessel {

namespace internal {
// Closed by StoreServer::stop() before the server shuts down: gRPC's in-process channel must
// not start calls on a server that is gone, so in-process clients check the gate (shared) for
// the length of each call and fail with PeerLost once it is closed.
struct InProcessGate {
  std::shared_mutex mutex;
  bool open = true;
};
}  // namespace internal

struct StoreClient::Impl {
  // address names the server in error messages ("127.0.0.1:4000", "in-process store").
  // gate is null for clients over a network channel.
  Impl(std::string address, std::string token, std::shared_ptr<grpc::Channel> channel,
       Nanoseconds rpc_timeout, std::shared_ptr<internal::InProcessGate> gate = nullptr);

  std::string address;
  std::shared_ptr<internal::InProcessGate> gate;
  std::string token;
  Nanoseconds rpc_timeout;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<storepb::Store::Stub> stub;
};

namespace internal {
// The channel arguments every store client uses (keepalive, message sizes, reconnect backoff).
grpc::ChannelArguments store_channel_arguments(const StoreClientOptions& options);
}  // namespace internal

}  // namespace tessel
