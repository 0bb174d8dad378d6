#include "tessel/store/store_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/store/internal/server_auth.h"
#include "tessel/store/internal/store_client_channel.h"
#include "tessel/store/internal/store_service.h"
#include "tessel/store/server_kit.h"

namespace tessel {
namespace {

// A blocking call's gRPC deadline is its timeout plus this: the server answers a timeout
// itself (naming the missing keys); the gRPC deadline only catches a server that cannot.
constexpr Nanoseconds kServerAnswerMargin = std::chrono::seconds(5);
constexpr Nanoseconds kLongestCall = std::chrono::hours(24 * 365);
constexpr int kKeepaliveMs = 30'000;
constexpr int kKeepaliveTimeoutMs = 10'000;

int to_ms(Nanoseconds d) {
  return static_cast<int>(std::clamp<int64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(d).count(), 1, 1 << 30));
}

const char* state_name(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE:
      return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
      return "CONNECTING";
    case GRPC_CHANNEL_READY:
      return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "TRANSIENT_FAILURE";
    case GRPC_CHANNEL_SHUTDOWN:
      return "SHUTDOWN";
  }
  return "unknown";
}

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    default:
      return "error";
  }
}

// A client context carrying the token, with a deadline `timeout` from now.
void prepare(grpc::ClientContext& context, const StoreClient::Impl& impl, Nanoseconds timeout) {
  context.AddMetadata(internal::kStoreTokenMetadata, impl.token);
  context.set_deadline(std::chrono::system_clock::now() + std::min(timeout, kLongestCall));
}

// Turns a failed call into a tessel error. `what` names the operation and its keys.
[[noreturn]] void throw_status(const StoreClient::Impl& impl, const grpc::Status& status,
                               const std::string& what, Nanoseconds deadline) {
  const std::string& text = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (text.rfind("key(s) ", 0) == 0) {  // the server's own answer names what is missing
        throw Timeout(fmt::format("store at {}: {}: {}", impl.address, what, text));
      }
      throw Timeout(fmt::format("store at {}: {}: no answer within {}", impl.address, what,
                                format_duration(deadline)));
    case grpc::StatusCode::UNAUTHENTICATED:
      throw CommError(fmt::format(
          "store at {} refused {}: missing or wrong token (UNAUTHENTICATED); the token comes "
          "from TESSEL_STORE_TOKEN or TESSEL_STORE_TOKEN_FILE",
          impl.address, what));
    case grpc::StatusCode::INVALID_ARGUMENT:
      throw InvalidArgument(fmt::format("store at {}: {}: {}", impl.address, what, text));
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      throw CommError(
          fmt::format("store at {} refused {}: {} (a server limit; see "
                      "StoreLimits, max_request_bytes for gRPC's own message)",
                      impl.address, what, text));
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
      throw PeerLost(
          fmt::format("store server at {} went away or is unreachable during {}: "
                      "{}: {}",
                      impl.address, what, code_name(status.error_code()), text));
    default:
      throw CommError(fmt::format("store at {}: {} failed: {}: {}", impl.address, what,
                                  code_name(status.error_code()), text));
  }
}

template <typename Request>
void add_keys(Request& request, const std::vector<std::string>& keys) {
  for (const auto& k : keys) request.add_keys(k);
}

std::string describe(const char* op, const std::vector<std::string>& keys) {
  return fmt::format("{} of {}", op, internal::quote_store_keys(keys));
}

}  // namespace

namespace internal {
grpc::ChannelArguments store_channel_arguments(const StoreClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, to_ms(options.connect_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, to_ms(options.connect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, to_ms(options.max_connect_backoff));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Each client its own connection: separate clients in one process do not share a socket.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}
}  // namespace internal

StoreClient::Impl::Impl(std::string address_in, std::string token_in,
                        std::shared_ptr<grpc::Channel> channel_in, Nanoseconds rpc_timeout_in,
                        std::shared_ptr<internal::InProcessGate> gate_in)
    : address(std::move(address_in)),
      gate(std::move(gate_in)),
      token(std::move(token_in)),
      rpc_timeout(rpc_timeout_in),
      channel(std::move(channel_in)),
      stub(storepb::Store::NewStub(channel)) {}

// One unary call: the token, the deadline, the in-process gate, and errors mapped to tessel's.
// `what` describes the call for messages (built only on failure).
template <typename Response, typename Request, typename Rpc, typename What>
Response call(const StoreClient::Impl& impl, Rpc rpc, const Request& request, Nanoseconds timeout,
              What&& what) {
  std::shared_lock<std::shared_mutex> gate_lock;
  if (impl.gate) {
    gate_lock = std::shared_lock(impl.gate->mutex);
    if (!impl.gate->open) {
      throw PeerLost(fmt::format("store server at {} stopped before {}", impl.address, what()));
    }
  }
  grpc::ClientContext context;
  prepare(context, impl, timeout);
  Response response;
  const grpc::Status status = (impl.stub.get()->*rpc)(&context, request, &response);
  if (!status.ok()) throw_status(impl, status, what(), timeout);
  return response;
}

bool StoreClient::is_available() { return true; }

StoreClient::StoreClient(StoreClientOptions options) : Store(options.default_timeout) {
  TESSEL_CHECK(!options.address.empty(), InvalidArgument,
               "StoreClient needs the store's address (host:port; TESSEL_STORE_ADDR)");
  TESSEL_CHECK(!options.token.empty(), InvalidArgument,
               "StoreClient for {} needs the job's token (TESSEL_STORE_TOKEN or "
               "TESSEL_STORE_TOKEN_FILE)",
               options.address);
  auto channel = grpc::CreateCustomChannel(options.address, client_channel_credentials(options.tls),
                                           internal::store_channel_arguments(options));
  TESSEL_CHECK(channel != nullptr, CommError, "could not create a gRPC channel to '{}'",
               options.address);
  // Connect: wait for the channel in growing windows (gRPC reconnects with the same backoff
  // underneath) until connect_timeout has passed in all.
  const Deadline give_up = Deadline::after(options.connect_timeout);
  Nanoseconds window = options.connect_backoff;
  int attempts = 0;
  while (true) {
    ++attempts;
    const auto until = std::min(give_up.when(), SteadyClock::now() + window);
    const auto system_until = std::chrono::system_clock::now() + (until - SteadyClock::now());
    if (channel->WaitForConnected(system_until)) break;
    if (give_up.expired()) {
      throw CommError(
          fmt::format("could not connect to the store server at {} within {} ({} attempts; channel "
                      "state {}); is the server running and the address right (TESSEL_STORE_ADDR)?",
                      options.address, format_duration(options.connect_timeout), attempts,
                      state_name(channel->GetState(false))));
    }
    window = std::min(window * 2, options.max_connect_backoff);
  }
  log_debug(LogComponent::kCollectives, "store client connected to {} after {} attempt(s)",
            options.address, attempts);
  impl_ = std::make_unique<Impl>(options.address, std::move(options.token), std::move(channel),
                                 options.rpc_timeout);
  // One call with the token at once: the server counts a connection as a stranger's until a
  // call on it carried the token, and limits those per address (connection_gate.h).
  call<storepb::CheckResponse>(*impl_, &storepb::Store::Stub::Check, storepb::CheckRequest(),
                               impl_->rpc_timeout,
                               [] { return std::string("the first call (token check)"); });
}

StoreClient::StoreClient(std::unique_ptr<Impl> impl, Nanoseconds default_timeout)
    : Store(default_timeout), impl_(std::move(impl)) {}

StoreClient::~StoreClient() = default;

const std::string& StoreClient::address() const { return impl_->address; }

void StoreClient::set(const std::string& key, const std::string& value) {
  storepb::SetRequest request;
  request.set_key(key);
  request.set_value(value);
  call<storepb::SetResponse>(*impl_, &storepb::Store::Stub::Set, request, impl_->rpc_timeout,
                             [&] { return describe("set", {key}); });
}

// get, multi_get and wait share one RPC.
static std::vector<std::string> blocking_get(const StoreClient::Impl& impl, const char* op,
                                             const std::vector<std::string>& keys, bool want_values,
                                             Nanoseconds timeout) {
  timeout = std::clamp(timeout, Nanoseconds::zero(), kLongestCall);
  storepb::GetRequest request;
  add_keys(request, keys);
  request.set_timeout_ns(timeout.count());
  request.set_want_values(want_values);
  const auto response =
      call<storepb::GetResponse>(impl, &storepb::Store::Stub::Get, request,
                                 timeout + kServerAnswerMargin, [&] { return describe(op, keys); });
  const size_t expected = want_values ? keys.size() : 0;
  TESSEL_CHECK(static_cast<size_t>(response.values_size()) == expected, CommError,
               "store at {} answered {} with {} values; expected {}", impl.address,
               describe(op, keys), response.values_size(), expected);
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

std::string StoreClient::get(const std::string& key, Nanoseconds timeout) {
  return blocking_get(*impl_, "get", {key}, true, timeout).front();
}

std::vector<std::string> StoreClient::multi_get(const std::vector<std::string>& keys,
                                                Nanoseconds timeout) {
  if (keys.empty()) return {};
  return blocking_get(*impl_, "multi_get", keys, true, timeout);
}

void StoreClient::wait(const std::vector<std::string>& keys, Nanoseconds timeout) {
  if (keys.empty()) return;
  blocking_get(*impl_, "wait", keys, false, timeout);
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  storepb::AddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  return call<storepb::AddResponse>(*impl_, &storepb::Store::Stub::Add, request, impl_->rpc_timeout,
                                    [&] { return describe("add", {key}); })
      .value();
}

std::string StoreClient::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  storepb::CompareSetRequest request;
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  return call<storepb::CompareSetResponse>(*impl_, &storepb::Store::Stub::CompareSet, request,
                                           impl_->rpc_timeout,
                                           [&] { return describe("compare_set", {key}); })
      .value();
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  storepb::CheckRequest request;
  add_keys(request, keys);
  return call<storepb::CheckResponse>(*impl_, &storepb::Store::Stub::Check, request,
                                      impl_->rpc_timeout, [&] { return describe("check", keys); })
      .all_present();
}

bool StoreClient::delete_key(const std::string& key) {
  storepb::DeleteKeyRequest request;
  request.set_key(key);
  return call<storepb::DeleteKeyResponse>(*impl_, &storepb::Store::Stub::DeleteKey, request,
                                          impl_->rpc_timeout,
                                          [&] { return describe("delete_key", {key}); })
      .existed();
}

void StoreClient::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  TESSEL_CHECK(keys.size() == values.size(), InvalidArgument, "multi_set: {} keys but {} values",
               keys.size(), values.size());
  storepb::MultiSetRequest request;
  add_keys(request, keys);
  for (const auto& v : values) request.add_values(v);
  call<storepb::MultiSetResponse>(*impl_, &storepb::Store::Stub::MultiSet, request,
                                  impl_->rpc_timeout, [&] { return describe("multi_set", keys); });
}

}  // namespace tessel
