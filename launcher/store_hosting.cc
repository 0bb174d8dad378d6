// The plug point for the gRPC Store (collectives/grpc/, branch h-store). When it lands,
// make_store_service returns its service object and connect_job_store its client; nothing else
// in the launcher changes.
#include "tessel/launcher/store_hosting.h"

#include <grpcpp/impl/codegen/service_type.h>

#include "tessel/collectives/store.h"

namespace tessel::launcher {

std::unique_ptr<grpc::Service> make_store_service(const std::string& /*token*/) {
  return nullptr;
}

std::shared_ptr<Store> connect_job_store(const std::string& /*address*/,
                                         const std::string& /*token*/) {
  return nullptr;
}

}  // namespace tessel::launcher
