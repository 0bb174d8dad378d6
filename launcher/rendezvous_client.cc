#include "tessel/launcher/rendezvous_client.h"

#include <thread>

#include "tessel/base/clock.h"
#include "tessel/base/logging.h"
#include "tessel/launcher/token.h"
#include "tessel/store/server_kit.h"

namespace tessel::launcher {

grpc::ChannelArguments control_plane_channel_args(bool private_connection) {
  grpc::ChannelArguments args;
  if (private_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_TCP_READ_CHUNK_SIZE, 4096);
  args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256);
  args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 65536);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return args;
}

RendezvousClient::RendezvousClient(std::string endpoint, std::string token,
                                   RendezvousClientOptions options)
    : endpoint_(std::move(endpoint)), token_(std::move(token)) {
  grpc::ChannelArguments args = control_plane_channel_args(options.private_connection);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect fast after a blip: the heartbeat bound is short.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(endpoint_, client_channel_credentials(options.tls), args);
  stub_ = proto::Rendezvous::NewStub(channel_);
}

void RendezvousClient::wait_connected(std::chrono::milliseconds timeout) {
  const Deadline deadline = Deadline::after(timeout);
  auto backoff = std::chrono::milliseconds(100);
  int attempts = 0;
  for (;;) {
    ++attempts;
    const auto wait = std::min<Nanoseconds>(backoff, deadline.remaining());
    if (channel_->WaitForConnected(std::chrono::system_clock::now() + wait)) {
      try {
        ping("", std::max(std::chrono::milliseconds(1000),
                          std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining())));
        return;
      } catch (const RpcError& e) {
        if (e.code() == grpc::StatusCode::UNAUTHENTICATED) throw;
      }
    }
    if (deadline.expired()) break;
    log_info(LogComponent::kLauncher, "rendezvous {} not reachable yet (attempt {}), retrying",
             endpoint_, attempts);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  throw Unavailable(fmt::format(
      "rendezvous endpoint {} unreachable: no answer after {} attempts over {} (backoff 100ms "
      "doubling to 2s); check --rdzv-endpoint and that the server's node is up",
      endpoint_, attempts, format_duration(timeout)));
}

void RendezvousClient::prepare(grpc::ClientContext& context,
                               std::chrono::milliseconds timeout) const {
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  context.AddMetadata(std::string(kJobTokenMetadataKey), token_);
}

namespace {

const char* status_code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    default:
      return "gRPC error";
  }
}

}  // namespace

void RendezvousClient::fail(const char* what, const grpc::Status& status) const {
  throw RpcError(
      fmt::format("rendezvous {} at {} failed: {} ({} {})", what, endpoint_, status.error_message(),
                  status_code_name(status.error_code()), static_cast<int>(status.error_code())),
      status.error_code());
}

proto::JoinResponse RendezvousClient::join(const proto::JoinRequest& request,
                                           std::chrono::milliseconds timeout,
                                           grpc::ClientContext* context) {
  grpc::ClientContext own;
  if (context == nullptr) context = &own;
  prepare(*context, timeout);
  proto::JoinResponse response;
  const grpc::Status status = stub_->Join(context, request, &response);
  if (!status.ok()) fail("Join", status);
  return response;
}

proto::HeartbeatResponse RendezvousClient::heartbeat(const std::string& node_id, int64_t round,
                                                     std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  prepare(context, timeout);
  proto::HeartbeatRequest request;
  request.set_node_id(node_id);
  request.set_round(round);
  proto::HeartbeatResponse response;
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) fail("Heartbeat", status);
  return response;
}

bool RendezvousClient::report_failure(const std::string& node_id, int64_t round,
                                      const proto::Failure& failure,
                                      std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  prepare(context, timeout);
  proto::FailureRequest request;
  request.set_node_id(node_id);
  request.set_round(round);
  *request.mutable_failure() = failure;
  proto::FailureResponse response;
  const grpc::Status status = stub_->ReportFailure(&context, request, &response);
  if (!status.ok()) fail("ReportFailure", status);
  return response.root_cause();
}

void RendezvousClient::report_done(const std::string& node_id, int64_t round,
                                   std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  prepare(context, timeout);
  proto::DoneRequest request;
  request.set_node_id(node_id);
  request.set_round(round);
  proto::DoneResponse response;
  const grpc::Status status = stub_->ReportDone(&context, request, &response);
  if (!status.ok()) fail("ReportDone", status);
}

proto::PingResponse RendezvousClient::ping(const std::string& node_id,
                                           std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  prepare(context, timeout);
  proto::PingRequest request;
  request.set_node_id(node_id);
  proto::PingResponse response;
  const grpc::Status status = stub_->Ping(&context, request, &response);
  if (!status.ok()) fail("Ping", status);
  return response;
}

proto::JobEvent RendezvousClient::wait_event(const std::string& node_id, int64_t round,
                                             std::chrono::milliseconds timeout,
                                             grpc::ClientContext* context) {
  prepare(*context, timeout);
  proto::WaitEventRequest request;
  request.set_node_id(node_id);
  request.set_round(round);
  proto::JobEvent event;
  const grpc::Status status = stub_->WaitEvent(context, request, &event);
  if (!status.ok()) fail("WaitEvent", status);
  return event;
}

}  // namespace tessel::launcher
