#pragma once
// The job's failure report: one root cause (on a hang, the flight recorder's verdict; otherwise
// the first failure by the rendezvous server's clock) as text for the console and as JSON
// (failure.json in the log directory).

#include <string>

#include "tessel/launcher/proto/rendezvous.pb.h"

namespace tessel::launcher {

// "SIGSEGV", "SIGKILL", ... ("signal 42" for unnamed ones).
std::string signal_name(int signal);

// The exit status tessel-run reports for a root cause: 128 + its signal when one killed the
// worker (or interrupted the job), else the worker's exit code; 1 when a whole node was lost.
int root_cause_exit_status(const proto::Failure& root_cause);

// "2026-11-21T21:20:45.113Z" for microseconds since the epoch.
std::string utc_time(int64_t us);

// "node 1 (10.0.0.2, host node-b)": how reports name a node (address and group rank).
std::string node_label(const proto::Failure& failure);
// The root cause in one line, for messages of exits that are not the job's failure itself
// (a rendezvous timeout after a restart, a lost server): "round 0: node 2 (...): node lost ...".
std::string one_line_root_cause(const proto::Failure& failure);

// The report people read:
//   tessel-run: job failed (root cause, first by the server's clock at 2026-...):
//     rank 3 (local 1) on host node-b, pid 4242: exited with code 1
//     last lines of its stderr: ...
std::string format_failure_report(const proto::Failure& root_cause, int restart_count,
                                  int max_restarts);

// The same as a JSON object (keys: host, node_id, addr, group_rank, error_file, rank,
// local_rank, pid, exit_code, signal, signal_name, reason, stderr_tail, server_time_us, round,
// restart_count, exit_status, and from the hang path: verdict, culprits, evidence, symptom,
// symptom_rank; excluded, outcome_note from --exclude-culprits). With a verdict that names
// culprits, rank is its first culprit.
std::string failure_report_json(const proto::Failure& root_cause, int restart_count);

// Writes failure_report_json to `path`. Throws IoError.
void write_failure_report(const std::string& path, const proto::Failure& root_cause,
                          int restart_count);

}  // namespace tessel::launcher
