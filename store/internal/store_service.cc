#include "tessel/store/internal/store_service.h"

#include <algorithm>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"

namespace tessel::internal {
namespace {

// Client keepalive pings arrive every 30 s; accept them (gRPC's default allows one per 5 min).
constexpr int kMinPingIntervalMs = 10'000;

std::vector<std::string> to_vector(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

// The status a store error becomes on the wire. Clients map it back (store_client.cc).
grpc::Status status_of(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalidArgument:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.message());
    case ErrorKind::kCommError:
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, e.message());
    case ErrorKind::kPeerLost:
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, e.message());
    default:
      return grpc::Status(grpc::StatusCode::INTERNAL, e.message());
  }
}

const grpc::Status& unauthenticated() {
  static const grpc::Status status(grpc::StatusCode::UNAUTHENTICATED,
                                   "missing or wrong tessel-store-token");
  return status;
}

// Runs op for an authorized caller and finishes the call with its outcome.
template <typename Op>
grpc::ServerUnaryReactor* answer(const StoreService& service, grpc::CallbackServerContext* context,
                                 Op&& op) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!service.authorized(*context)) {
    reactor->Finish(unauthenticated());
    return reactor;
  }
  try {
    op();
    reactor->Finish(grpc::Status::OK);
  } catch (const Error& e) {
    reactor->Finish(status_of(e));
  } catch (const std::exception& e) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
  }
  return reactor;
}

// get / multi_get / wait: parks in the table until the keys exist, the timeout passes, the
// server stops, or the caller cancels. Deletes itself when gRPC is done with the call.
class GetReactor final : public grpc::ServerUnaryReactor, public StoreWaiter {
 public:
  GetReactor(StoreTable& table, const storepb::GetRequest& request, storepb::GetResponse* response)
      : table_(table), response_(response), timeout_(Nanoseconds(request.timeout_ns())) {}

  void start(const storepb::GetRequest& request) {
    try {
      auto values =
          table_.get_or_park(to_vector(request.keys()), request.want_values(), timeout_, this);
      if (values) finish(WaitEnd::kReady, std::move(*values));
    } catch (const Error& e) {
      Finish(status_of(e));
    } catch (const std::exception& e) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
    }
  }

  void finish(WaitEnd end, std::vector<std::string> values) override {
    switch (end) {
      case WaitEnd::kReady:
        for (auto& v : values) response_->add_values(std::move(v));
        Finish(grpc::Status::OK);
        return;
      case WaitEnd::kTimeout:
        Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            fmt::format("key(s) {} not set within {}", quote_store_keys(values),
                                        format_duration(timeout_))));
        return;
      case WaitEnd::kStopped:
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the store server stopped"));
        return;
    }
  }

  void OnCancel() override {
    if (table_.cancel(this)) Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  StoreTable& table_;
  storepb::GetResponse* response_;
  const Nanoseconds timeout_;
};

}  // namespace

StoreService::StoreService(std::string token, StoreLimits limits)
    : token_(std::move(token)), table_(limits) {
  TESSEL_CHECK(!token_.empty(), InvalidArgument, "the store service needs a non-empty token");
  table_.start();
}

StoreService::~StoreService() { stop(); }

void StoreService::stop() { table_.stop(); }

bool StoreService::authorized(const grpc::CallbackServerContext& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kStoreTokenMetadata);
  if (it == metadata.end() || !token_matches(it->second.data(), it->second.size(), token_)) {
    return false;
  }
  if (gate_ != nullptr) gate_->authenticated(context.peer());
  return true;
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const storepb::SetRequest* request,
                                            storepb::SetResponse*) {
  return answer(*this, context, [&] { table_.set(request->key(), request->value()); });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const storepb::GetRequest* request,
                                            storepb::GetResponse* response) {
  if (!authorized(*context)) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(unauthenticated());
    return reactor;
  }
  auto* reactor = new GetReactor(table_, *request, response);
  reactor->start(*request);
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const storepb::AddRequest* request,
                                            storepb::AddResponse* response) {
  return answer(*this, context,
                [&] { response->set_value(table_.add(request->key(), request->delta())); });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const storepb::CompareSetRequest* request,
                                                   storepb::CompareSetResponse* response) {
  return answer(*this, context, [&] {
    response->set_value(
        table_.compare_set(request->key(), request->expected(), request->desired()));
  });
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context,
                                              const storepb::CheckRequest* request,
                                              storepb::CheckResponse* response) {
  return answer(*this, context,
                [&] { response->set_all_present(table_.check(to_vector(request->keys()))); });
}

grpc::ServerUnaryReactor* StoreService::DeleteKey(grpc::CallbackServerContext* context,
                                                  const storepb::DeleteKeyRequest* request,
                                                  storepb::DeleteKeyResponse* response) {
  return answer(*this, context, [&] { response->set_existed(table_.delete_key(request->key())); });
}

grpc::ServerUnaryReactor* StoreService::MultiSet(grpc::CallbackServerContext* context,
                                                 const storepb::MultiSetRequest* request,
                                                 storepb::MultiSetResponse*) {
  return answer(*this, context, [&] {
    table_.multi_set(to_vector(request->keys()), to_vector(request->values()));
  });
}

ConnectionLimits connection_limits(const StoreLimits& limits) {
  ConnectionLimits c;
  c.max_unauthenticated_per_peer = limits.max_unauthenticated_connections_per_peer;
  c.max_unauthenticated = limits.max_unauthenticated_connections;
  return c;
}

void add_store_service(grpc::ServerBuilder& builder, StoreService& service) {
  const StoreLimits& limits = service.limits();
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<size_t>(limits.max_request_bytes, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.RegisterService(&service);
}

}  // namespace tessel::internal
