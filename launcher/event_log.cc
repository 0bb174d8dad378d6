#include "tessel/launcher/event_log.h"

#include <fmt/ranges.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/launcher/failure_report.h"

namespace tessel::launcher {
namespace {

const char* kind_name(proto::JobEvent::Kind k) {
  switch (k) {
    case proto::JobEvent::RESTART:
      return "restart";
    case proto::JobEvent::SUCCEEDED:
      return "succeeded";
    case proto::JobEvent::FAILED:
      return "failed";
    case proto::JobEvent::STOP:
      return "stopped";
    default:
      return "none";
  }
}

}  // namespace

std::string exclusion_label(const proto::Exclusion& x) {
  return fmt::format("node {} ({}, host {})", x.group_rank(), x.addr(), x.host());
}

EventLog::EventLog(const std::string& path, std::string host, std::string run_id)
    : host_(std::move(host)), run_id_(std::move(run_id)) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "ae");
  if (file_ == nullptr) {
    throw IoError(
        fmt::format("--event-log {}: cannot open for appending ({})", path, std::strerror(errno)));
  }
}

EventLog::~EventLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventLog::emit(const std::string& json_fields, const std::string& line) {
  std::fprintf(stderr, "tessel-run: %s\n", line.c_str());
  if (file_ == nullptr) return;
  nlohmann::json j = nlohmann::json::parse(json_fields);
  const int64_t now = wall_time_us();
  j["time_us"] = now;
  j["time"] = utc_time(now);
  j["host"] = host_;
  j["run_id"] = run_id_;
  const std::string text = j.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), file_);  // one line per event, then flushed
  std::fflush(file_);
}

void EventLog::round_started(const proto::JoinResponse& r, const std::string& addr) {
  nlohmann::json j = {{"event", "round_started"},           {"round", r.round()},
                      {"restart_count", r.restart_count()}, {"nodes", r.group_world_size()},
                      {"world_size", r.world_size()},       {"group_rank", r.group_rank()},
                      {"rank_offset", r.rank_offset()},     {"addr", addr}};
  emit(j.dump(), fmt::format("round {} started: {} node{}, world size {}, restart {} (this node: "
                             "group rank {}, ranks from {})",
                             r.round(), r.group_world_size(), r.group_world_size() == 1 ? "" : "s",
                             r.world_size(), r.restart_count(), r.group_rank(), r.rank_offset()));
}

void EventLog::round_failed(const proto::JobEvent& e) {
  const proto::Failure& f = e.root_cause();
  nlohmann::json j = {
      {"event", "round_failed"},
      {"round", f.round()},
      {"outcome", kind_name(e.kind())},
      {"next_round", e.round()},
      {"restart_count", e.restart_count()},
      {"root_cause", nlohmann::json::parse(failure_report_json(f, e.restart_count()))}};
  std::string line = fmt::format("round {} failed: {}", f.round(), one_line_root_cause(f));
  // The verdict and its evidence when they named the culprit (a verdict that names nobody is
  // in the log and the report, not in the event line).
  if (!f.culprits().empty()) {
    line += fmt::format("; {}", f.verdict());
    if (!f.evidence().empty()) line += fmt::format("; evidence: {}", f.evidence(0));
  }
  emit(j.dump(), line);
  for (const proto::Exclusion& x : f.excluded()) {
    nlohmann::json xj = {{"event", "node_excluded"},     {"round", x.round()},
                         {"node_host", x.host()},        {"node_addr", x.addr()},
                         {"group_rank", x.group_rank()}, {"ranks", x.ranks()},
                         {"reason", x.reason()}};
    emit(xj.dump(), fmt::format("{} taken out of the job for its life{}: {}", exclusion_label(x),
                                x.ranks().empty()
                                    ? " (the node was lost)"
                                    : fmt::format(" (culprit ranks {})", fmt::join(x.ranks(), ",")),
                                x.reason()));
  }
  if (!f.outcome_note().empty()) {
    nlohmann::json nj = {{"event", "job_cannot_continue"}, {"reason", f.outcome_note()}};
    emit(nj.dump(), f.outcome_note());
  }
}

void EventLog::server_lost(const proto::Failure& cause, const std::string& next, bool serving) {
  nlohmann::json j = {{"event", "server_lost"},
                      {"round", cause.round()},
                      {"lost_addr", cause.addr()},
                      {"lost_host", cause.host()},
                      {"group_rank", cause.group_rank()},
                      {"reason", cause.reason()},
                      {"next_endpoint", next},
                      {"serving", serving}};
  emit(j.dump(), next.empty()
                     ? fmt::format("round {} failed: {}", cause.round(), one_line_root_cause(cause))
                     : fmt::format("round {} failed: {}; the job goes on with the "
                                   "rendezvous server at {}{}",
                                   cause.round(), one_line_root_cause(cause), next,
                                   serving ? " (this node serves it)" : ""));
}

void EventLog::node_refused(const std::string& message) {
  nlohmann::json j = {{"event", "node_refused"}, {"reason", message}};
  emit(j.dump(), message);
}

void EventLog::job_finished(const std::string& status, int exit_status) {
  nlohmann::json j = {{"event", "job_finished"}, {"status", status}, {"exit_status", exit_status}};
  emit(j.dump(), fmt::format("job {}; tessel-run exits with status {}", status, exit_status));
}

}  // namespace tessel::launcher
