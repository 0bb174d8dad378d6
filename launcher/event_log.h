#pragma once
// What tessel-run tells people and cluster tooling about the course of a job: one line per
// event on stderr ("tessel-run: round 0 failed: ...") and, with --event-log PATH, the same
// event as one JSON object per line appended to PATH (schema in docs/launching.md#event-log).
//
//   EventLog events(o.event_log, host, addr, run_id);
//   events.round_started(join_response);
//   events.round_failed(job_event);     // the culprit, its evidence, the nodes taken out
//
// Not thread-safe: used by the agent's main thread.

#include <cstdio>
#include <string>

#include "tessel/launcher/proto/rendezvous.pb.h"

namespace tessel::launcher {

class EventLog {
 public:
  // PATH "" writes the lines only. Throws IoError when PATH cannot be opened for appending.
  EventLog(const std::string& path, std::string host, std::string run_id);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // This node's agent joined round R: the new world.
  void round_started(const proto::JoinResponse& r, const std::string& addr);
  // The round ended by a failure (RESTART, FAILED, STOP): the root cause (the culprit and its
  // evidence) and every node it took out of the job.
  void round_failed(const proto::JobEvent& e);
  // The rendezvous server's node is gone (CAUSE); the job goes on with the server at NEXT
  // (served by this node when SERVING), or ends when NEXT is "".
  void server_lost(const proto::Failure& cause, const std::string& next, bool serving);
  // This node was refused: it was taken out of the job earlier.
  void node_refused(const std::string& message);
  // The job ended: succeeded, failed or stopped, and tessel-run's exit status here.
  void job_finished(const std::string& status, int exit_status);

 private:
  void emit(const std::string& json_fields, const std::string& line);

  std::string host_, run_id_;
  std::FILE* file_ = nullptr;
};

// "node 2 (10.77.1.3, host c)": how lines name an excluded node.
std::string exclusion_label(const proto::Exclusion& x);

}  // namespace tessel::launcher
