#pragma once
// Where the job's Store (collectives/store.h, gRPC service from the collectives issue) meets
// the launcher. The rendezvous server registers the Store service on its own
// grpc::ServerBuilder, so workers reach the store at TESSEL_STORE_ADDR (the rendezvous address)
// with TESSEL_STORE_TOKEN; the launcher itself connects as a client to gather flight-recorder
// dumps. Until the gRPC store lands, both functions answer "not built in" (nullptr).

#include <memory>
#include <string>

namespace grpc {
class Service;
}

namespace tessel {
class Store;
}

namespace tessel::launcher {

// The Store service to host beside the rendezvous service, checking `token` on every RPC;
// nullptr when this build has no gRPC Store service. The caller registers it on its
// ServerBuilder and keeps it alive until the server has shut down.
std::unique_ptr<grpc::Service> make_store_service(const std::string& token);

// A client of the job's store at `address` ("HOST:PORT"), or nullptr when this build has no
// gRPC store client.
std::shared_ptr<Store> connect_job_store(const std::string& address, const std::string& token);

}  // namespace tessel::launcher
