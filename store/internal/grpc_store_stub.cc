// The Store server and client in a build without gRPC: is_available() is false and making one
// throws Unavailable, so callers need no #ifdef.
#include "tessel/base/error.h"
#include "tessel/store/store_client.h"
#include "tessel/store/store_server.h"

namespace tessel {
namespace {

[[noreturn]] void no_grpc(const char* what) {
  throw Unavailable(fmt::format(
      "{} needs gRPC, which this build of tessel lacks; rebuild with -DTESSEL_WITH_GRPC=ON "
      "(scripts/setup.sh installs it)",
      what));
}

}  // namespace

struct StoreServer::Impl {};
struct StoreClient::Impl {};

bool StoreServer::is_available() { return false; }
StoreServer::StoreServer(StoreServerOptions) { no_grpc("StoreServer"); }
StoreServer::~StoreServer() = default;
const std::string& StoreServer::address() const { no_grpc("StoreServer"); }
int StoreServer::port() const { no_grpc("StoreServer"); }
const std::string& StoreServer::token() const { no_grpc("StoreServer"); }
const StoreLimits& StoreServer::limits() const { no_grpc("StoreServer"); }
StoreServerStats StoreServer::stats() const { no_grpc("StoreServer"); }
std::shared_ptr<Store> StoreServer::connect(Nanoseconds) { no_grpc("StoreServer"); }
void StoreServer::stop() {}

bool StoreClient::is_available() { return false; }
StoreClient::StoreClient(StoreClientOptions) { no_grpc("StoreClient"); }
StoreClient::StoreClient(std::unique_ptr<Impl>, Nanoseconds) { no_grpc("StoreClient"); }
StoreClient::~StoreClient() = default;
const std::string& StoreClient::address() const { no_grpc("StoreClient"); }
void StoreClient::set(const std::string&, const std::string&) { no_grpc("StoreClient"); }
std::string StoreClient::get(const std::string&, Nanoseconds) { no_grpc("StoreClient"); }
int64_t StoreClient::add(const std::string&, int64_t) { no_grpc("StoreClient"); }
std::string StoreClient::compare_set(const std::string&, const std::string&, const std::string&) {
  no_grpc("StoreClient");
}
void StoreClient::wait(const std::vector<std::string>&, Nanoseconds) { no_grpc("StoreClient"); }
bool StoreClient::check(const std::vector<std::string>&) { no_grpc("StoreClient"); }
bool StoreClient::delete_key(const std::string&) { no_grpc("StoreClient"); }
std::vector<std::string> StoreClient::multi_get(const std::vector<std::string>&, Nanoseconds) {
  no_grpc("StoreClient");
}
void StoreClient::multi_set(const std::vector<std::string>&, const std::vector<std::string>&) {
  no_grpc("StoreClient");
}

}  // namespace tessel
