#include "tessel/launcher/round_control.h"

#include <unistd.h>

#include <algorithm>

#include "tessel/base/clock.h"
#include "tessel/base/logging.h"

namespace tessel::launcher {
namespace {

constexpr auto kL = LogComponent::kLauncher;

}  // namespace

RoundControl::RoundControl(RendezvousClient& client, std::string node_id, int64_t round,
                           std::chrono::milliseconds interval, int misses, int event_fd)
    : client_(client),
      node_id_(std::move(node_id)),
      round_(round),
      interval_(interval),
      misses_(misses),
      event_fd_(event_fd) {
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  watcher_ = std::thread([this] { watch_loop(); });
}

RoundControl::~RoundControl() { stop(); }

void RoundControl::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    if (call_) call_->TryCancel();
  }
  cv_.notify_all();
  heartbeat_.join();
  watcher_.join();
}

std::optional<ControlEvent> RoundControl::take() {
  std::lock_guard lock(mu_);
  if (events_.empty()) return std::nullopt;
  ControlEvent e = events_.front();
  events_.pop_front();
  return e;
}

proto::HeartbeatResponse RoundControl::last_heartbeat() {
  std::lock_guard lock(mu_);
  return last_answer_;
}

void RoundControl::push(ControlEvent e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  const uint64_t one = 1;
  (void)!::write(event_fd_, &one, sizeof(one));
}

void RoundControl::heartbeat_loop() {
  auto last_ok = SteadyClock::now();
  auto last_pass = last_ok;
  const auto bound = interval_ * misses_;
  std::unique_lock lock(mu_);
  for (;;) {
    const bool stopping = cv_.wait_for(lock, interval_, [&] { return stopped_; });
    lock.unlock();
    if (const auto gap = SteadyClock::now() - last_pass; gap > bound) {
      // Our own silence (SIGSTOP, a paused VM, CPU starvation), not the server's. Said even
      // when the round's event, which the silence caused, stops this thread first.
      log_warn(kL,
               "this node did not run for {} (stopped or starved), longer than the "
               "heartbeat bound {}: the rendezvous server may have declared it lost",
               format_duration(gap), format_duration(bound));
      last_ok = SteadyClock::now();
    }
    if (stopping) {
      lock.lock();
      return;
    }
    bool stale = false, refused = false;
    try {
      proto::HeartbeatResponse answer =
          client_.heartbeat(node_id_, round_, std::max(interval_, std::chrono::milliseconds(200)));
      last_ok = SteadyClock::now();
      std::lock_guard answer_lock(mu_);
      last_answer_ = std::move(answer);
    } catch (const RpcError& e) {
      stale = e.code() == grpc::StatusCode::FAILED_PRECONDITION;
      if (e.code() == grpc::StatusCode::UNAUTHENTICATED) stale = true;
      // The server's host answered that nothing listens there: its process is gone, which no
      // wait for the bound would change.
      refused = e.code() == grpc::StatusCode::UNAVAILABLE &&
                e.message().find("onnection refused") != std::string::npos;
    }
    last_pass = SteadyClock::now();
    if (refused) {
      log_warn(kL,
               "the rendezvous server {} refused the connection: it is gone; stopping this "
               "node's workers",
               client_.endpoint());
      push({.server_lost = true, .refused = true, .event = {}});
      lock.lock();
      return;
    }
    if (!stale && SteadyClock::now() - last_ok > bound) {
      log_warn(kL,
               "no answer from the rendezvous server {} for {} (the heartbeat bound): "
               "stopping this node's workers and joining the job again",
               client_.endpoint(), format_duration(SteadyClock::now() - last_ok));
      push({.server_lost = true, .refused = false, .event = {}});
      lock.lock();
      return;
    }
    lock.lock();
    if (stale) return;  // the round is over; its event is on the way
  }
}

void RoundControl::watch_loop() {
  for (;;) {
    auto context = std::make_shared<grpc::ClientContext>();
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      call_ = context;
    }
    try {
      proto::JobEvent event = client_.wait_event(
          node_id_, round_, kEventPollLimit + std::chrono::seconds(5), context.get());
      if (event.kind() != proto::JobEvent::NONE) {
        push({.server_lost = false, .refused = false, .event = event});
        return;
      }
    } catch (const RpcError& e) {
      std::unique_lock lock(mu_);
      if (stopped_) return;
      // The server restarts or a link blips: retry; the heartbeat thread decides loss.
      cv_.wait_for(lock, interval_, [&] { return stopped_; });
    }
  }
}

}  // namespace tessel::launcher
