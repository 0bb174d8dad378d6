#include "tessel/store/store_server.h"

#include <grpcpp/grpcpp.h>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/store/internal/store_client_channel.h"
#include "tessel/store/internal/store_service.h"

namespace tessel {
namespace {

// "host:port" with a non-empty host and a port in [0, 65535]; returns the host.
std::string checked_host(const std::string& address) {
  const auto colon = address.rfind(':');
  TESSEL_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
               InvalidArgument, "store server address '{}' is not host:port (e.g. 127.0.0.1:0)",
               address);
  const std::string port = address.substr(colon + 1);
  TESSEL_CHECK(port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos &&
                   std::stoi(port) <= 65535,
               InvalidArgument, "store server address '{}' has port '{}'; expected 0 to 65535",
               address, port);
  return address.substr(0, colon);
}

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions options;
  std::string address;
  int port = 0;
  std::unique_ptr<internal::StoreService> service;
  std::unique_ptr<internal::ConnectionGate> connections;  // null when in-process only
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<internal::InProcessGate> gate = std::make_shared<internal::InProcessGate>();
  std::mutex stop_mutex;
  bool stopped = false;
};

bool StoreServer::is_available() { return true; }

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  if (options.token.empty()) options.token = generate_store_token();
  impl_->service = std::make_unique<internal::StoreService>(options.token, options.limits);
  grpc::ServerBuilder builder;
  std::string host;
  if (!options.address.empty()) {
    host = checked_host(options.address);
    try {
      impl_->connections = std::make_unique<internal::ConnectionGate>(
          options.address, internal::connection_limits(options.limits));
    } catch (const IoError& e) {
      throw IoError(
          fmt::format("store server could not listen on '{}' (address in use or not "
                      "local?): {}",
                      options.address, e.message()));
    }
    impl_->port = impl_->connections->port();
    impl_->connections->attach(builder,
                               internal::token_server_credentials(options.token, options.tls));
    impl_->service->set_gate(impl_->connections.get());
  }
  internal::add_store_service(builder, *impl_->service);
  impl_->server = builder.BuildAndStart();
  TESSEL_CHECK(impl_->server != nullptr, IoError, "store server for '{}' did not start",
               options.address);
  if (impl_->connections) impl_->connections->start();
  if (!options.address.empty()) impl_->address = fmt::format("{}:{}", host, impl_->port);
  impl_->options = std::move(options);
  log_info(LogComponent::kCollectives, "store server listening on {}",
           impl_->address.empty() ? std::string("(in-process only)") : impl_->address);
}

StoreServer::~StoreServer() { stop(); }

const std::string& StoreServer::address() const { return impl_->address; }
int StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::token() const { return impl_->options.token; }
const StoreLimits& StoreServer::limits() const { return impl_->options.limits; }
StoreServerStats StoreServer::stats() const {
  StoreServerStats stats = impl_->service->stats();
  if (impl_->connections) {
    const internal::ConnectionGateStats gate = impl_->connections->stats();
    stats.connections = gate.connections;
    stats.unauthenticated_connections = gate.unauthenticated;
    stats.refused_connections = gate.refused + gate.evicted;
  }
  return stats;
}

std::shared_ptr<Store> StoreServer::connect(Nanoseconds default_timeout) {
  std::lock_guard lock(impl_->stop_mutex);
  TESSEL_CHECK(!impl_->stopped, PeerLost, "store server at {} stopped; cannot connect to it",
               impl_->address.empty() ? std::string("(in-process)") : impl_->address);
  StoreClientOptions client_options;
  client_options.default_timeout = default_timeout;
  auto channel = impl_->server->InProcessChannel(internal::store_channel_arguments(client_options));
  auto impl = std::make_unique<StoreClient::Impl>("in-process store", impl_->options.token,
                                                  std::move(channel), client_options.rpc_timeout,
                                                  impl_->gate);
  return std::make_shared<StoreClient>(std::move(impl), default_timeout);
}

void StoreServer::stop() {
  std::lock_guard lock(impl_->stop_mutex);
  if (impl_->stopped) return;
  impl_->stopped = true;
  if (impl_->connections) impl_->connections->stop();  // no new connections
  // Parked calls first, so their clients hear "stopped" instead of a cancelled stream.
  impl_->service->stop();
  {
    std::unique_lock gate_lock(impl_->gate->mutex);  // in-process calls in flight finish first
    impl_->gate->open = false;
  }
  impl_->server->Shutdown(std::chrono::system_clock::now() + impl_->options.shutdown_grace);
  impl_->server->Wait();
  log_info(LogComponent::kCollectives, "store server on {} stopped",
           impl_->address.empty() ? std::string("(in-process)") : impl_->address);
}

}  // namespace tessel
