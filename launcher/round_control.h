#pragma once
// The node agent's two control threads for one round: heartbeats to the rendezvous server every
// interval (and the judgement that the server is lost), and the long-poll for the round's job
// event (restart, success, failure). What they see is queued as a ControlEvent and announced on
// an eventfd that the agent's epoll watches, so the agent's main thread never blocks on them.
//
//   RoundControl control(client, node_id, round, interval, misses, event_fd);
//   ...  // event_fd readable:
//   while (auto e = control.take()) { ... }
//   control.stop();

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tessel/launcher/proto/rendezvous.pb.h"
#include "tessel/launcher/rendezvous_client.h"

namespace tessel::launcher {

// How long the rendezvous server holds a job-event long-poll open before answering NONE
// (RendezvousServerOptions::poll_limit); the agent's call waits 5 s longer.
inline constexpr std::chrono::seconds kEventPollLimit{10};

// What the control threads saw: the server lost (no heartbeat answered within the bound, or
// its host refused the connection: at once), or the round's job event.
struct ControlEvent {
  bool server_lost = false;
  bool refused = false;  // with server_lost: its host refused the connection (the server is gone)
  proto::JobEvent event;
};

// Thread-safe: take() and stop() may be called from any thread. Owns its two threads, started
// by the constructor and joined by stop() or the destructor. Borrows CLIENT and EVENT_FD, which
// must outlive it.
class RoundControl {
 public:
  // Heartbeats for ROUND every INTERVAL; the server counts as lost after INTERVAL * MISSES
  // without an answer (a stale round's answer ends the heartbeats: its event is on the way).
  RoundControl(RendezvousClient& client, std::string node_id, int64_t round,
               std::chrono::milliseconds interval, int misses, int event_fd);
  ~RoundControl();
  RoundControl(const RoundControl&) = delete;
  RoundControl& operator=(const RoundControl&) = delete;

  // Cancels the long-poll and joins both threads. Idempotent.
  void stop();
  // The oldest queued event, or nullopt when none is queued. Never blocks.
  std::optional<ControlEvent> take();
  // The server's last answer to a heartbeat (what a standby needs to take the job over).
  proto::HeartbeatResponse last_heartbeat();

 private:
  void push(ControlEvent e);
  void heartbeat_loop();
  void watch_loop();

  RendezvousClient& client_;
  const std::string node_id_;
  const int64_t round_;
  const std::chrono::milliseconds interval_;
  const int misses_;
  const int event_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;                       // guarded by mu_
  std::shared_ptr<grpc::ClientContext> call_;  // guarded by mu_: the long-poll in flight
  std::deque<ControlEvent> events_;            // guarded by mu_
  proto::HeartbeatResponse last_answer_;       // guarded by mu_
  std::thread heartbeat_;
  std::thread watcher_;
};

}  // namespace tessel::launcher
