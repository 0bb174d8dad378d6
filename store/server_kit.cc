#include "tessel/store/server_kit.h"

#include "tessel/base/error.h"
#include "tessel/store/internal/connection_gate.h"
#include "tessel/store/internal/server_auth.h"
#include "tessel/store/internal/store_service.h"

namespace tessel {

static_assert(kJobTokenMetadataKey == std::string_view(internal::kRendezvousTokenKey),
              "the co-hosted services' token key is the one the server credentials check");

struct StoreServerKit::Impl {
  StoreServerKitOptions options;
  std::unique_ptr<internal::ConnectionGate> gate;
  std::unique_ptr<internal::StoreService> store;  // null when the store is not hosted
  bool attached = false;
};

StoreServerKit::StoreServerKit(StoreServerKitOptions options) : impl_(std::make_unique<Impl>()) {
  TESSEL_CHECK(!options.token.empty(), InvalidArgument,
               "a store server kit needs the job's token; got an empty one");
  impl_->gate = std::make_unique<internal::ConnectionGate>(
      options.address, internal::connection_limits(options.limits));
  if (options.host_store) {
    impl_->store = std::make_unique<internal::StoreService>(options.token, options.limits);
    impl_->store->set_gate(impl_->gate.get());
  }
  impl_->options = std::move(options);
}

StoreServerKit::~StoreServerKit() {
  stop_accepting();
  stop_store();
}

int StoreServerKit::port() const { return impl_->gate->port(); }
bool StoreServerKit::hosts_store() const { return impl_->store != nullptr; }

void StoreServerKit::attach(grpc::ServerBuilder& builder) {
  TESSEL_CHECK(!impl_->attached, InvalidArgument,
               "StoreServerKit::attach called twice; a kit serves one gRPC server");
  impl_->attached = true;
  impl_->gate->attach(builder,
                      internal::token_server_credentials(impl_->options.token, impl_->options.tls));
  if (impl_->store) internal::add_store_service(builder, *impl_->store);
}

void StoreServerKit::start() { impl_->gate->start(); }

void StoreServerKit::authenticated(std::string_view peer) { impl_->gate->authenticated(peer); }

void StoreServerKit::stop_accepting() { impl_->gate->stop(); }

void StoreServerKit::stop_store() {
  if (impl_->store) impl_->store->stop();
}

StoreServerStats StoreServerKit::stats() const {
  StoreServerStats stats = impl_->store ? impl_->store->stats() : StoreServerStats{};
  const internal::ConnectionGateStats gate = impl_->gate->stats();
  stats.connections = gate.connections;
  stats.unauthenticated_connections = gate.unauthenticated;
  stats.refused_connections = gate.refused + gate.evicted;
  return stats;
}

}  // namespace tessel
