#include "tessel/launcher/rendezvous_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/launcher/failure_report.h"
#include "tessel/launcher/hang_dump.h"
#include "tessel/launcher/proto/rendezvous.grpc.pb.h"
#include "tessel/launcher/token.h"
#include "tessel/store/server_kit.h"

namespace tessel::launcher {
namespace {

using proto::JobEvent;
constexpr auto kL = LogComponent::kLauncher;
// The exit status of a worker whose configuration cannot work (base/tools/cli.h's
// kExitBadValue, tessel-run's own invalid-config status): the job is not restarted.
constexpr int kConfigurationExitCode = 65;

// "ipv4:10.0.0.2:5555" -> "10.0.0.2"; "ipv6:[::1]:5555" -> "::1".
std::string peer_host(const std::string& peer) {
  std::string rest = peer.substr(peer.find(':') + 1);
  if (!rest.empty() && rest.front() == '[') return rest.substr(1, rest.find(']') - 1);
  return rest.substr(0, rest.rfind(':'));
}

// A node's identity across agents (an agent killed and started again is the same node).
std::string node_key(const std::string& host, const std::string& addr) { return host + " " + addr; }

// What an exclusion refuses: the machine (host and address), or one agent of it when others of
// the job share the machine.
std::string exclusion_key(const proto::Exclusion& x) {
  std::string key = node_key(x.host(), x.addr());
  if (!x.node_id().empty()) key += " " + x.node_id();
  return key;
}

// Signals that end a worker through no decision of the job's: a crash, or a kill from outside.
bool fatal_signal(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGABRT ||
         sig == SIGKILL || sig == SIGSYS;
}

grpc::Status unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or wrong job token (x-tessel-token)");
}

}  // namespace

// A unary call the server answers later (a Join waiting for its round, a WaitEvent long-poll).
// Owned by gRPC: deletes itself in OnDone. The State finishes it exactly once: whoever removes
// it from the State's lists (under the State's mutex) calls Finish.
class ParkedCall final : public grpc::ServerUnaryReactor {
 public:
  explicit ParkedCall(RendezvousServer::State* state) : state_(state) {}
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  RendezvousServer::State* state_;
};

class RendezvousServer::State {
 public:
  explicit State(RendezvousServerOptions options) : options_(std::move(options)) {
    round_ = options_.first_round;
    outcome_.restart_count = options_.restarts_done;
    for (const proto::Exclusion& x : options_.excluded) {
      excluded_[exclusion_key(x)] = x;
      exclusion_order_.push_back(x);
    }
    if (options_.takeover_cause) {
      root_ = *options_.takeover_cause;
      if (options_.restarts_done > options_.max_restarts) {
        outcome_.restart_count = options_.max_restarts;
        outcome_.kind = JobEvent::FAILED;
        phase_ = Phase::kFinished;
        outcome_.root_cause = root_;
      }
    }
  }

  const RendezvousServerOptions& options() const { return options_; }
  void set_kit(StoreServerKit* kit) { kit_ = kit; }

  // The call carries the job token (network calls without it were refused on their headers;
  // this check stays for defence in depth), and its connection is marked as authenticated.
  bool authenticated(grpc::CallbackServerContext* ctx) {
    const auto& md = ctx->client_metadata();
    auto it = md.find(std::string(kJobTokenMetadataKey));
    if (it == md.end() ||
        !tokens_equal(std::string_view(it->second.data(), it->second.size()), options_.token)) {
      return false;
    }
    if (kit_ != nullptr) kit_->authenticated(ctx->peer());
    return true;
  }

  grpc::ServerUnaryReactor* join(grpc::CallbackServerContext* ctx, const proto::JoinRequest* req,
                                 proto::JoinResponse* resp) {
    if (!authenticated(ctx)) return finish_now(ctx, unauthenticated());
    std::unique_lock lock(mu_);
    if (phase_ == Phase::kFinished) {
      return finish_now(
          ctx, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the job has already finished"));
    }
    check_stall_locked(lock);
    const std::string addr = req->addr().empty() ? peer_host(ctx->peer()) : req->addr();
    if (auto d = died_.find(req->node_id()); d != died_.end()) {
      // Taken out because its connection closed, yet the same agent joins: it did not die (it
      // gave the server up after the heartbeat bound and cancelled its calls). It stays in.
      log_warn(kL, "node {} ({}) was taken out as dead but its agent joins again: it stays in",
               req->node_id(), addr);
      excluded_.erase(d->second);
      died_.erase(d);
    }
    if (const proto::Exclusion* x = exclusion_of_locked(req->host(), addr, req->node_id())) {
      return finish_now(ctx, excluded_status(*x));
    }
    if (grpc::Status taken = check_rank_free_locked(*req); !taken.ok()) {
      return finish_now(ctx, taken);
    }
    // A member of the running round joining again lost its link to the server (or its agent
    // was stopped) long enough to give its round up: the round cannot go on without it.
    if (auto m = members_.find(req->node_id());
        m != members_.end() && phase_ == Phase::kRunning && !round_failed_ && !m->second.done) {
      proto::Failure failure = node_failure_locked(
          req->node_id(), "lost contact with the rendezvous server and rejoined");
      fail_round_locked(std::move(failure), lock);
    }
    std::vector<Finisher> replaced;  // an earlier Join of the same agent (its link blipped)
    for (auto it = joining_.begin(); it != joining_.end();) {
      if (it->request.node_id() != req->node_id()) {
        ++it;
        continue;
      }
      replaced.push_back({it->call, grpc::Status(grpc::StatusCode::ABORTED,
                                                 "replaced by a newer Join of the same agent")});
      it = joining_.erase(it);
    }
    auto* call = new ParkedCall(this);
    joining_.push_back({*req, addr, call, resp});
    finish_all(std::move(replaced), lock);
    log_info(kL, "node {} ({}) joined round {} ({} waiting, nnodes {}:{})", req->node_id(),
             req->host(), round_, joining_.size(), options_.min_nodes, options_.max_nodes);
    if (phase_ == Phase::kJoining) {
      if (static_cast<int>(joining_.size()) >= options_.max_nodes) {
        finish_all(form_round_locked(), lock);
      } else if (static_cast<int>(joining_.size()) >= options_.min_nodes && !last_call_) {
        last_call_ = SteadyClock::now() + options_.last_call_timeout;
        cv_.notify_all();
      }
    } else if (phase_ == Phase::kRunning && !round_failed_ && !pending_hang_ &&
               static_cast<int>(members_.size() + joining_.size()) <= options_.max_nodes) {
      finish_all(scale_up_locked(req->node_id()), lock);
    }
    return call;
  }

  grpc::ServerUnaryReactor* heartbeat(grpc::CallbackServerContext* ctx,
                                      const proto::HeartbeatRequest* req,
                                      proto::HeartbeatResponse* resp) {
    if (!authenticated(ctx)) return finish_now(ctx, unauthenticated());
    std::unique_lock lock(mu_);
    check_stall_locked(lock);
    resp->set_current_round(round_);
    grpc::Status status = check_member_locked(req->node_id(), req->round());
    if (status.ok()) {
      members_[req->node_id()].last_seen = SteadyClock::now();
      resp->set_standby_addr(standby_addr_locked());
      resp->set_restart_count(outcome_.restart_count);
      resp->set_server_host(options_.host_name);
      for (const proto::Exclusion& x : exclusion_order_) *resp->add_excluded() = x;
    }
    return finish_now(ctx, status);
  }

  grpc::ServerUnaryReactor* report_failure(grpc::CallbackServerContext* ctx,
                                           const proto::FailureRequest* req,
                                           proto::FailureResponse* resp) {
    if (!authenticated(ctx)) return finish_now(ctx, unauthenticated());
    std::unique_lock lock(mu_);
    grpc::Status status = check_member_locked(req->node_id(), req->round());
    if (!status.ok()) return finish_now(ctx, status);
    proto::Failure failure = req->failure();
    failure.set_node_id(req->node_id());
    if (auto m = members_.find(req->node_id()); m != members_.end()) {
      failure.set_addr(m->second.assignment.addr());
      failure.set_group_rank(m->second.assignment.group_rank());
      if (failure.host().empty()) failure.set_host(m->second.assignment.host());
    }
    resp->set_root_cause(fail_round_locked(std::move(failure), lock));
    return finish_now(ctx, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* report_done(grpc::CallbackServerContext* ctx,
                                        const proto::DoneRequest* req, proto::DoneResponse*) {
    if (!authenticated(ctx)) return finish_now(ctx, unauthenticated());
    std::unique_lock lock(mu_);
    grpc::Status status = check_member_locked(req->node_id(), req->round());
    if (!status.ok()) return finish_now(ctx, status);
    members_[req->node_id()].done = true;
    const bool all_done =
        std::all_of(members_.begin(), members_.end(), [](const auto& m) { return m.second.done; });
    if (all_done && !round_failed_) {
      outcome_.kind = JobEvent::SUCCEEDED;
      finish_all(finish_job_locked(), lock);
    }
    return finish_now(ctx, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ping(grpc::CallbackServerContext* ctx, const proto::PingRequest*,
                                 proto::PingResponse* resp) {
    if (!authenticated(ctx)) return finish_now(ctx, unauthenticated());
    std::lock_guard lock(mu_);
    resp->set_current_round(round_);
    resp->set_finished(phase_ == Phase::kFinished);
    return finish_now(ctx, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* wait_event(grpc::CallbackServerContext* ctx,
                                       const proto::WaitEventRequest* req, JobEvent* resp) {
    if (!authenticated(ctx)) return finish_now(ctx, unauthenticated());
    std::lock_guard lock(mu_);
    if (event_ready_locked(req->node_id(), req->round(), resp)) {
      return finish_now(ctx, grpc::Status::OK);
    }
    auto* call = new ParkedCall(this);
    waits_.push_back(
        {req->node_id(), req->round(), call, resp, SteadyClock::now() + options_.poll_limit});
    return call;
  }

  // A parked call's client went away. A member's long-poll cancelled while its round runs
  // means its agent died (the connection closed): the round fails now, not after the
  // heartbeat bound.
  void on_cancel(ParkedCall* call) {
    std::unique_lock lock(mu_);
    for (auto it = joining_.begin(); it != joining_.end(); ++it) {
      if (it->call == call) {
        joining_.erase(it);
        if (static_cast<int>(joining_.size()) < options_.min_nodes) last_call_.reset();
        lock.unlock();
        call->Finish(grpc::Status::CANCELLED);
        return;
      }
    }
    for (auto it = waits_.begin(); it != waits_.end(); ++it) {
      if (it->call != call) continue;
      const std::string node_id = it->node_id;
      const int64_t round = it->round;
      waits_.erase(it);
      if (!stopping_ && phase_ == Phase::kRunning && round == round_ &&
          members_.count(node_id) != 0 && !members_[node_id].done) {
        proto::Failure failure =
            node_failure_locked(node_id, "node lost (its agent's connection closed)");
        members_[node_id].lost = true;
        members_[node_id].died = true;
        fail_round_locked(std::move(failure), lock);
      }
      if (lock.owns_lock()) lock.unlock();
      call->Finish(grpc::Status::CANCELLED);
      return;
    }
  }

  // One pass of the monitor thread: last call, heartbeat deadlines, long-poll expiry, hangs.
  void monitor_loop() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      const auto now = SteadyClock::now();
      if (phase_ == Phase::kJoining && last_call_ && now >= *last_call_) {
        finish_all(form_round_locked(), lock);
        continue;
      }
      if (check_stall_locked(lock)) continue;
      if (phase_ == Phase::kRunning && !round_failed_) {
        const auto bound = options_.heartbeat_interval * options_.heartbeat_misses;
        for (auto& [id, m] : members_) {
          if (m.done || now - m.last_seen <= bound) continue;
          proto::Failure failure = node_failure_locked(
              id,
              fmt::format("node lost (no heartbeat for {})", format_duration(now - m.last_seen)));
          if (every_other_node_silent_locked(now)) failure = own_node_cut_off_locked();
          m.lost = true;
          fail_round_locked(std::move(failure), lock);
          break;
        }
        if (!lock.owns_lock()) lock.lock();
      }
      if (pending_hang_) {
        pending_hang_ = false;
        const proto::Failure root = root_;
        const int64_t round = round_;
        const int world = world_size_;
        lock.unlock();
        std::optional<proto::Failure> first;
        try {
          first = options_.on_hang(root, round, world);
        } catch (const std::exception& e) {
          log_error(kL, "gathering flight-recorder dumps failed: {}", e.what());
        }
        lock.lock();
        if (first) {
          first->set_server_time_us(root_.server_time_us());
          first->set_round(root_.round());
          if (first->addr().empty()) name_node_of_rank_locked(*first);
          root_ = std::move(*first);
        }
        last_tick_ = SteadyClock::now();  // busy gathering dumps, not stalled
        finish_all(end_round_locked(), lock);
        continue;
      }
      std::vector<Finisher> expired;
      for (auto it = waits_.begin(); it != waits_.end();) {
        if (now >= it->expires) {
          it->response->set_kind(JobEvent::NONE);
          it->response->set_round(round_);
          expired.push_back({it->call, grpc::Status::OK});
          it = waits_.erase(it);
        } else {
          ++it;
        }
      }
      if (!expired.empty()) {
        finish_all(std::move(expired), lock);
        continue;
      }
      auto wake = now + options_.heartbeat_interval;
      if (last_call_) wake = std::min(wake, *last_call_);
      last_tick_ = SteadyClock::now();
      cv_.wait_until(lock, wake);
    }
  }

  void stop_job(const proto::Failure& cause) {
    std::unique_lock lock(mu_);
    if (phase_ == Phase::kFinished) return;
    root_ = cause;
    root_.set_server_time_us(wall_time_us());
    outcome_.kind = JobEvent::STOP;
    finish_all(finish_job_locked(), lock);
  }

  JobOutcome wait_outcome(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return phase_ == Phase::kFinished; });
    return phase_ == Phase::kFinished ? outcome_ : JobOutcome{};
  }

  bool wait_all_notified(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      return phase_ == Phase::kFinished &&
             std::all_of(members_.begin(), members_.end(),
                         [](const auto& m) { return m.second.notified || m.second.lost; });
    });
  }

  int64_t round() const {
    std::lock_guard lock(mu_);
    return round_;
  }
  size_t parked() const {
    std::lock_guard lock(mu_);
    return joining_.size() + waits_.size();
  }
  int restart_count() const {
    std::lock_guard lock(mu_);
    return outcome_.restart_count;
  }
  std::vector<proto::Exclusion> excluded() const {
    std::lock_guard lock(mu_);
    return exclusion_order_;
  }

  // Marks the server as stopping: cancellations are no longer failures; the monitor exits.
  void begin_stop() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

 private:
  enum class Phase { kJoining, kRunning, kFinished };
  struct PendingJoin {
    proto::JoinRequest request;
    std::string addr;
    ParkedCall* call;
    proto::JoinResponse* response;
  };
  struct PendingWait {
    std::string node_id;
    int64_t round;
    ParkedCall* call;
    JobEvent* response;
    SteadyClock::time_point expires;
  };
  struct Member {
    proto::NodeAssignment assignment;
    SteadyClock::time_point last_seen;
    int requested_rank = -1;
    bool done = false;
    bool notified = false;
    bool lost = false;  // its agent is gone: nobody to notify
    bool died = false;  // its agent's connection closed while the round ran
  };
  struct Finisher {
    ParkedCall* call;
    grpc::Status status;
  };

  grpc::ServerUnaryReactor* finish_now(grpc::CallbackServerContext* ctx, grpc::Status status) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }

  // Finishes calls outside the lock (gRPC may run reactions inline), then re-locks.
  void finish_all(std::vector<Finisher> calls, std::unique_lock<std::mutex>& lock) {
    cv_.notify_all();
    if (calls.empty()) return;
    lock.unlock();
    for (auto& f : calls) f.call->Finish(f.status);
    lock.lock();
  }

  // A whole node's failure, named by its address and group rank.
  proto::Failure node_failure_locked(const std::string& node_id, const std::string& reason) {
    proto::Failure failure;
    failure.set_node_id(node_id);
    failure.set_rank(-1);
    failure.set_reason(reason);
    if (auto m = members_.find(node_id); m != members_.end()) {
      failure.set_host(m->second.assignment.host());
      failure.set_addr(m->second.assignment.addr());
      failure.set_group_rank(m->second.assignment.group_rank());
    }
    return failure;
  }

  // The server's own threads did not run for longer than the heartbeat bound (its node was
  // stopped, or starved): every agent has given the running round up by now, and the fault
  // is the server's, not the first node whose heartbeat looks stale. True when it failed the
  // round.
  bool check_stall_locked(std::unique_lock<std::mutex>& lock) {
    const auto now = SteadyClock::now();
    const auto gap = now - last_tick_;
    const auto bound = options_.heartbeat_interval * options_.heartbeat_misses;
    if (gap <= bound || stopping_) return false;
    last_tick_ = now;
    for (auto& [id, m] : members_) m.last_seen = now;  // their silence was ours
    if (phase_ != Phase::kRunning || round_failed_) return false;
    proto::Failure failure;
    failure.set_rank(-1);
    failure.set_host(options_.host_name);
    failure.set_addr(options_.bind_address);
    failure.set_group_rank(-1);
    failure.set_reason(
        fmt::format("the rendezvous server did not run for {} (its node was "
                    "stopped or starved), longer than the heartbeat bound {}",
                    format_duration(gap), format_duration(bound)));
    log_warn(kL, "{}", failure.reason());
    fail_round_locked(std::move(failure), lock);
    if (!lock.owns_lock()) lock.lock();
    return true;
  }

  // Two nodes asking for the same --node-rank: the second is refused (ALREADY_EXISTS). (An
  // agent that died is gone from these lists as soon as its connection closes.)
  grpc::Status check_rank_free_locked(const proto::JoinRequest& req) {
    const int r = req.requested_rank();
    if (r < 0) return grpc::Status::OK;
    for (const auto& j : joining_) {
      if (j.request.requested_rank() == r && j.request.node_id() != req.node_id()) {
        return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                            fmt::format("--node-rank {} is already taken by node {} ({}, host "
                                        "{}); every node needs its own rank",
                                        r, j.addr, j.request.node_id(), j.request.host()));
      }
    }
    if (phase_ == Phase::kRunning && !round_failed_) {
      for (const auto& [id, m] : members_) {
        if (m.requested_rank == r && id != req.node_id()) {
          return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                              fmt::format("--node-rank {} is already taken by node {} ({}, host "
                                          "{}); every node needs its own rank",
                                          r, m.assignment.addr(), id, m.assignment.host()));
        }
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status check_member_locked(const std::string& node_id, int64_t round) const {
    if (round != round_ || phase_ != Phase::kRunning) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          fmt::format("stale round {}: the job is in round {} ({})", round, round_,
                                      phase_ == Phase::kRunning ? "running" : "not running"));
    }
    if (members_.count(node_id) == 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          fmt::format("node {} is not a member of round {}", node_id, round_));
    }
    return grpc::Status::OK;
  }

  // Assigns ranks to the joined nodes (up to max_nodes) and answers their Joins.
  std::vector<Finisher> form_round_locked() {
    last_call_.reset();
    const size_t n = std::min(joining_.size(), static_cast<size_t>(options_.max_nodes));
    std::vector<PendingJoin> nodes(joining_.begin(), joining_.begin() + n);
    joining_.erase(joining_.begin(), joining_.begin() + n);
    std::sort(nodes.begin(), nodes.end(), [](const PendingJoin& a, const PendingJoin& b) {
      const auto key = [](const PendingJoin& j) {
        const int r = j.request.requested_rank();
        return std::make_tuple(r < 0, r, j.request.host(), j.request.node_id());
      };
      return key(a) < key(b);
    });
    members_.clear();
    std::vector<proto::NodeAssignment> assignments;
    int offset = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      proto::NodeAssignment a;
      a.set_node_id(nodes[i].request.node_id());
      a.set_host(nodes[i].request.host());
      a.set_addr(nodes[i].addr);
      a.set_group_rank(static_cast<int>(i));
      a.set_nproc(nodes[i].request.nproc());
      a.set_rank_offset(offset);
      offset += nodes[i].request.nproc();
      assignments.push_back(a);
      members_[a.node_id()] = Member{a, SteadyClock::now(), nodes[i].request.requested_rank()};
    }
    world_size_ = offset;
    const std::string master_addr =
        options_.master_addr.empty() ? nodes.front().addr : options_.master_addr;
    const int master_port =
        options_.master_port != 0 ? options_.master_port : nodes.front().request.master_port();
    std::vector<Finisher> done;
    for (size_t i = 0; i < nodes.size(); ++i) {
      proto::JoinResponse* r = nodes[i].response;
      r->set_round(round_);
      r->set_restart_count(outcome_.restart_count);
      r->set_group_rank(static_cast<int>(i));
      r->set_group_world_size(static_cast<int>(nodes.size()));
      r->set_world_size(world_size_);
      r->set_rank_offset(assignments[i].rank_offset());
      r->set_master_addr(master_addr);
      r->set_master_port(master_port);
      r->set_heartbeat_interval_ms(options_.heartbeat_interval.count());
      done.push_back({nodes[i].call, grpc::Status::OK});
    }
    phase_ = Phase::kRunning;
    round_failed_ = false;
    log_info(kL, "round {} formed: {} nodes, world size {}", round_, nodes.size(), world_size_);
    return done;
  }

  // Records a failure of the running round; true when it is the round's root cause. May
  // release the lock (to answer waiting calls); the caller re-checks state afterwards.
  bool fail_round_locked(proto::Failure failure, std::unique_lock<std::mutex>& lock) {
    if (phase_ != Phase::kRunning || round_failed_) return false;
    round_failed_ = true;
    if (auto m = members_.find(failure.node_id()); m != members_.end() && failure.addr().empty()) {
      failure.set_addr(m->second.assignment.addr());
      failure.set_group_rank(m->second.assignment.group_rank());
    }
    failure.set_server_time_us(wall_time_us());
    failure.set_round(round_);
    root_ = std::move(failure);
    log_warn(kL, "round {} failed: node {} rank {}: {}", round_, root_.node_id(), root_.rank(),
             root_.reason());
    if ((root_.hang() || options_.dump_on_hang) && options_.on_hang && root_.rank() >= 0) {
      pending_hang_ = true;  // the monitor gathers dumps, then ends the round
      cv_.notify_all();
      return true;
    }
    finish_all(end_round_locked(), lock);
    return true;
  }

  // A node arrived while a round runs and the job may still grow: end the round and form the
  // next one with every node, as torchrun does. A membership change, not a failure: no restart
  // is counted against --max-restarts.
  std::vector<Finisher> scale_up_locked(const std::string& node_id) {
    log_info(kL, "node {} arrived while round {} runs with {} of at most {} nodes: new round {}",
             node_id, round_, members_.size(), options_.max_nodes, round_ + 1);
    root_ = proto::Failure();
    root_.set_rank(-1);
    root_.set_round(round_);
    root_.set_reason(fmt::format("membership change: node {} joined", node_id));
    root_.set_server_time_us(wall_time_us());
    ++round_;
    phase_ = Phase::kJoining;
    std::vector<Finisher> done = answer_waits_locked();
    if (static_cast<int>(joining_.size()) >= options_.min_nodes) {
      last_call_ = SteadyClock::now() + options_.last_call_timeout;
      cv_.notify_all();
    }
    return done;
  }

  // The node that takes the job over if this server's node is lost: the lowest group rank of
  // the round on another address than the server's.
  std::string standby_addr_locked() const {
    const std::string own = options_.bind_address.substr(0, options_.bind_address.rfind(':'));
    const proto::NodeAssignment* best = nullptr;
    for (const auto& [id, m] : members_) {
      const auto& a = m.assignment;
      if (a.addr() == own || (best != nullptr && best->group_rank() < a.group_rank())) continue;
      best = &a;
    }
    return best == nullptr ? "" : best->addr();
  }

  // Every member on another address than the server's has been silent for half the bound or
  // more, and there are two or more: it is this node that lost the network, not each of them.
  bool every_other_node_silent_locked(SteadyClock::time_point now) const {
    const std::string own = options_.bind_address.substr(0, options_.bind_address.rfind(':'));
    const auto half = options_.heartbeat_interval * options_.heartbeat_misses / 2;
    int remote = 0;
    for (const auto& [id, m] : members_) {
      if (m.assignment.addr() == own || m.done) continue;
      if (now - m.last_seen < half) return false;
      ++remote;
    }
    return remote >= 2;
  }

  proto::Failure own_node_cut_off_locked() const {
    proto::Failure f;
    const std::string own = options_.bind_address.substr(0, options_.bind_address.rfind(':'));
    f.set_rank(-1);
    f.set_host(options_.host_name);
    f.set_addr(own);
    f.set_group_rank(-1);
    for (const auto& [id, m] : members_) {
      if (m.assignment.addr() == own) {
        f.set_node_id(id);
        f.set_group_rank(m.assignment.group_rank());
      }
    }
    f.set_reason(
        "the rendezvous server's node lost contact with every other node at once (its link is "
        "down, or the others' is)");
    return f;
  }

  // The member whose ranks include RANK, or null.
  const Member* member_of_rank_locked(int rank) const {
    for (const auto& [id, m] : members_) {
      const auto& a = m.assignment;
      if (rank >= a.rank_offset() && rank < a.rank_offset() + a.nproc()) return &m;
    }
    return nullptr;
  }

  // The verdict named a rank the first report did not come from: name its node too.
  void name_node_of_rank_locked(proto::Failure& f) const {
    if (const Member* m = member_of_rank_locked(f.rank())) {
      f.set_node_id(m->assignment.node_id());
      f.set_addr(m->assignment.addr());
      f.set_group_rank(m->assignment.group_rank());
      if (f.host().empty()) f.set_host(m->assignment.host());
    }
  }

  // The exclusion that refuses an agent: its machine's, or its own.
  const proto::Exclusion* exclusion_of_locked(const std::string& host, const std::string& addr,
                                              const std::string& node_id) const {
    for (const std::string& key : {node_key(host, addr), node_key(host, addr) + " " + node_id}) {
      if (auto x = excluded_.find(key); x != excluded_.end()) return &x->second;
    }
    return nullptr;
  }

  grpc::Status excluded_status(const proto::Exclusion& x) const {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        fmt::format("this node ({}, host {}) was taken out of the job after round {}: {}", x.addr(),
                    x.host(), x.round(), x.reason()));
  }

  // The nodes the round's root cause blames, when exclude_culprits is on: the nodes of the
  // verdict's culprits when they hung or crashed (a culprit that exited with its own code is
  // the program's error, which any node would repeat), the node of a worker killed by a fatal
  // signal, a node lost. Nothing for interrupts, membership changes, a node that lost contact
  // and came back, a verdict that names nobody (INCONCLUSIVE, stragglers).
  std::vector<proto::Exclusion> culprit_nodes_locked() const {
    std::vector<proto::Exclusion> out;
    if (!options_.exclude_culprits) return out;
    const proto::Failure& r = root_;
    std::map<std::string, std::vector<int>> ranks;  // node id -> its culprit ranks
    if (r.reason() == "interrupted" || r.reason().rfind("membership change", 0) == 0) return out;
    if (!r.culprits().empty()) {
      // Hung (124) or killed; a culprit that exited with its own code is the program's error.
      const bool node_fault = r.signal() != 0 || r.exit_code() == kCollectiveTimeoutExitCode;
      for (int c : r.culprits()) {
        const Member* m = node_fault ? member_of_rank_locked(c) : nullptr;
        if (m != nullptr) ranks[m->assignment.node_id()].push_back(c);
      }
    } else if (r.rank() >= 0 && fatal_signal(r.signal())) {
      if (const Member* m = member_of_rank_locked(r.rank()))
        ranks[m->assignment.node_id()].push_back(r.rank());
    }
    // A node whose agent died during the round is gone whatever the verdict says: its
    // workers' peers may have reported their own failures first. (A node that only fell
    // silent, a link blip or a starved agent, is not taken out: it may come back.)
    for (const auto& [id, m] : members_) {
      if (m.died) ranks[id];
    }
    for (const auto& [id, culprit_ranks] : ranks) {
      const proto::NodeAssignment& a = members_.at(id).assignment;
      proto::Exclusion x;
      x.set_host(a.host());
      x.set_addr(a.addr());
      // Another agent that is no culprit runs on the same machine: take out this agent only.
      for (const auto& [other_id, other] : members_) {
        if (ranks.count(other_id) == 0 && other.assignment.host() == a.host() &&
            other.assignment.addr() == a.addr()) {
          x.set_node_id(id);
          break;
        }
      }
      x.set_group_rank(a.group_rank());
      x.set_round(round_);
      x.set_reason(one_line_root_cause(r));
      for (int c : culprit_ranks) x.add_ranks(c);
      out.push_back(std::move(x));
    }
    return out;
  }

  // Takes the root cause's culprit nodes out of the job. Returns false when too few nodes
  // would be left (root_ then says why).
  bool exclude_culprits_locked(std::vector<Finisher>& refused) {
    const std::vector<proto::Exclusion> taken = culprit_nodes_locked();
    if (taken.empty()) return true;
    for (const proto::Exclusion& x : taken) {
      for (const auto& [id, m] : members_) {
        if (m.died && m.assignment.host() == x.host() && m.assignment.addr() == x.addr() &&
            (x.node_id().empty() || x.node_id() == id)) {
          died_[id] = exclusion_key(x);
        }
      }
      excluded_[exclusion_key(x)] = x;
      exclusion_order_.push_back(x);
      *root_.add_excluded() = x;
      log_warn(kL, "node {} ({}, host {}) is taken out of the job for its life: {}", x.group_rank(),
               x.addr(), x.host(), x.reason());
    }
    for (auto it = joining_.begin(); it != joining_.end();) {
      const proto::Exclusion* x =
          exclusion_of_locked(it->request.host(), it->addr, it->request.node_id());
      if (x == nullptr) {
        ++it;
        continue;
      }
      refused.push_back({it->call, excluded_status(*x)});
      it = joining_.erase(it);
    }
    int left = 0;
    for (const auto& [id, m] : members_) {
      left += exclusion_of_locked(m.assignment.host(), m.assignment.addr(), id) == nullptr ? 1 : 0;
    }
    if (left >= options_.min_nodes) return true;
    std::string names;
    for (const proto::Exclusion& x : taken) {
      names += fmt::format("{}node {} ({})", names.empty() ? "" : ", ", x.group_rank(), x.addr());
    }
    root_.set_outcome_note(fmt::format(
        "taking out {} leaves {} node{} of the round's {}, fewer than the --nnodes minimum {}: "
        "the job cannot go on",
        names, left, left == 1 ? "" : "s", members_.size(), options_.min_nodes));
    log_error(kL, "{}", root_.outcome_note());
    return false;
  }

  // Ends a failed round: the next round when restarts are left, else the job fails.
  std::vector<Finisher> end_round_locked() {
    const bool interrupted = root_.reason() == "interrupted";
    // A worker that exited 65 said its configuration cannot work in this world (train_gpt's
    // --dp-shard 3 on 4 ranks): every restart would repeat it.
    const bool unfit =
        root_.rank() >= 0 && root_.signal() == 0 && root_.exit_code() == kConfigurationExitCode;
    if (unfit) {
      root_.set_outcome_note(fmt::format(
          "rank {} exited {}: its configuration cannot work with {} ranks on {} node{} (its "
          "message says why); a restart would repeat it, so the job ends here",
          root_.rank(), kConfigurationExitCode, world_size_, members_.size(),
          members_.size() == 1 ? "" : "s"));
      log_error(kL, "{}", root_.outcome_note());
    }
    const bool fatal = interrupted || unfit;
    std::vector<Finisher> refused;
    const bool enough = fatal || exclude_culprits_locked(refused);
    if (!enough || fatal || outcome_.restart_count >= options_.max_restarts) {
      outcome_.kind = interrupted ? JobEvent::STOP : JobEvent::FAILED;
      std::vector<Finisher> done = finish_job_locked();
      done.insert(done.end(), refused.begin(), refused.end());
      return done;
    }
    ++outcome_.restart_count;
    ++round_;
    phase_ = Phase::kJoining;
    log_info(kL, "restart {} of {}: round {}", outcome_.restart_count, options_.max_restarts,
             round_);
    std::vector<Finisher> done = answer_waits_locked();
    done.insert(done.end(), refused.begin(), refused.end());
    if (static_cast<int>(joining_.size()) >= options_.min_nodes) {
      last_call_ = SteadyClock::now() + options_.last_call_timeout;
    }
    return done;
  }

  std::vector<Finisher> finish_job_locked() {
    phase_ = Phase::kFinished;
    outcome_.root_cause = root_;
    std::vector<Finisher> done = answer_waits_locked();
    for (auto& j : joining_) {
      done.push_back({j.call, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                           "the job has already finished")});
    }
    joining_.clear();
    return done;
  }

  std::vector<Finisher> answer_waits_locked() {
    std::vector<Finisher> done;
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (event_ready_locked(it->node_id, it->round, it->response)) {
        done.push_back({it->call, grpc::Status::OK});
        it = waits_.erase(it);
      } else {
        ++it;
      }
    }
    return done;
  }

  // Fills `event` when something happened since `round` for this node.
  bool event_ready_locked(const std::string& node_id, int64_t round, JobEvent* event) {
    if (phase_ == Phase::kFinished) {
      event->set_kind(outcome_.kind);
      event->set_round(round_);
      *event->mutable_root_cause() = outcome_.root_cause;
      event->set_restart_count(outcome_.restart_count);
      if (auto it = members_.find(node_id); it != members_.end()) it->second.notified = true;
      cv_.notify_all();
      return true;
    }
    if (round < round_) {
      event->set_kind(JobEvent::RESTART);
      event->set_round(round_);
      *event->mutable_root_cause() = root_;
      event->set_restart_count(outcome_.restart_count);
      return true;
    }
    return false;
  }

  const RendezvousServerOptions options_;
  StoreServerKit* kit_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Phase phase_ = Phase::kJoining;
  int64_t round_ = 0;
  int world_size_ = 0;
  std::optional<SteadyClock::time_point> last_call_;
  std::vector<PendingJoin> joining_;
  std::vector<PendingWait> waits_;
  std::map<std::string, Member> members_;
  std::map<std::string, proto::Exclusion> excluded_;  // by node_key: refused for the job's life
  std::vector<proto::Exclusion> exclusion_order_;
  std::map<std::string, std::string> died_;  // node id -> exclusion key of nodes taken out as dead
  bool round_failed_ = false;
  bool pending_hang_ = false;
  proto::Failure root_;
  JobOutcome outcome_;
  bool stopping_ = false;
  SteadyClock::time_point last_tick_ = SteadyClock::now();  // the monitor's last pass
};

void ParkedCall::OnCancel() { state_->on_cancel(this); }

namespace {

class RendezvousService final : public proto::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(RendezvousServer::State* state) : state_(state) {}
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* c, const proto::JoinRequest* q,
                                 proto::JoinResponse* r) override {
    return state_->join(c, q, r);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* c,
                                      const proto::HeartbeatRequest* q,
                                      proto::HeartbeatResponse* r) override {
    return state_->heartbeat(c, q, r);
  }
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* c,
                                          const proto::FailureRequest* q,
                                          proto::FailureResponse* r) override {
    return state_->report_failure(c, q, r);
  }
  grpc::ServerUnaryReactor* ReportDone(grpc::CallbackServerContext* c, const proto::DoneRequest* q,
                                       proto::DoneResponse* r) override {
    return state_->report_done(c, q, r);
  }
  grpc::ServerUnaryReactor* WaitEvent(grpc::CallbackServerContext* c,
                                      const proto::WaitEventRequest* q,
                                      proto::JobEvent* r) override {
    return state_->wait_event(c, q, r);
  }
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* c, const proto::PingRequest* q,
                                 proto::PingResponse* r) override {
    return state_->ping(c, q, r);
  }

 private:
  RendezvousServer::State* state_;
};

}  // namespace

struct RendezvousServer::Impl {
  std::unique_ptr<RendezvousService> service;
  // The socket, the token credentials and the job's Store beside rendezvous; outlives server.
  std::unique_ptr<StoreServerKit> kit;
  std::unique_ptr<grpc::Server> server;
  std::thread monitor;
  std::string address;
  int port = 0;
  bool stopped = false;
};

RendezvousServer::RendezvousServer(RendezvousServerOptions options)
    : state_(std::make_unique<State>(std::move(options))), impl_(std::make_unique<Impl>()) {
  const auto& o = state_->options();
  TESSEL_CHECK(o.min_nodes >= 1 && o.min_nodes <= o.max_nodes, InvalidArgument,
               "rendezvous needs 1 <= min_nodes <= max_nodes, got {}:{}", o.min_nodes, o.max_nodes);
  impl_->service = std::make_unique<RendezvousService>(state_.get());
  try {
    impl_->kit = std::make_unique<StoreServerKit>(StoreServerKitOptions{
        .address = o.bind_address, .token = o.token, .tls = o.tls, .host_store = o.host_store});
  } catch (const Error& e) {
    throw CommError(
        fmt::format("cannot serve the rendezvous at {}: the address is in use or "
                    "not local ({})",
                    o.bind_address, e.message()));
  }
  impl_->port = impl_->kit->port();
  grpc::ServerBuilder builder;
  impl_->kit->attach(builder);
  state_->set_kit(impl_->kit.get());
  builder.RegisterService(impl_->service.get());
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Thousands of agent connections: small read buffers, no BDP probing (as the clients).
  builder.AddChannelArgument(GRPC_ARG_TCP_READ_CHUNK_SIZE, 4096);
  builder.AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 256);
  builder.AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 65536);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  grpc::ResourceQuota quota("tessel-rendezvous");
  quota.Resize(size_t{512} << 20);  // buffers shrink under pressure instead of growing unbounded
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  impl_->server = builder.BuildAndStart();
  TESSEL_CHECK(impl_->server != nullptr, CommError, "cannot serve the rendezvous at {}",
               o.bind_address);
  impl_->kit->start();
  impl_->address =
      o.bind_address.substr(0, o.bind_address.rfind(':') + 1) + std::to_string(impl_->port);
  impl_->monitor = std::thread([this] { state_->monitor_loop(); });
  log_info(LogComponent::kLauncher, "rendezvous server on {} (store service {})", impl_->address,
           impl_->kit->hosts_store() ? "hosted" : "off");
}

RendezvousServer::~RendezvousServer() { stop(); }

const std::string& RendezvousServer::address() const { return impl_->address; }
int RendezvousServer::port() const { return impl_->port; }
void RendezvousServer::stop_job(const proto::Failure& cause) { state_->stop_job(cause); }
JobOutcome RendezvousServer::wait_outcome(std::chrono::milliseconds timeout) {
  return state_->wait_outcome(timeout);
}
bool RendezvousServer::wait_all_notified(std::chrono::milliseconds timeout) {
  return state_->wait_all_notified(timeout);
}
int64_t RendezvousServer::current_round() const { return state_->round(); }
int RendezvousServer::restart_count() const { return state_->restart_count(); }
std::vector<proto::Exclusion> RendezvousServer::excluded() const { return state_->excluded(); }
size_t RendezvousServer::parked_calls() const { return state_->parked(); }

void RendezvousServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->kit->stop_accepting();  // no new connections
  state_->begin_stop();
  impl_->kit->stop_store();  // parked store calls fail first
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->server->Wait();
  if (impl_->monitor.joinable()) impl_->monitor.join();
}

}  // namespace tessel::launcher
