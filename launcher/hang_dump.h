#pragma once
// Hang handling: when a worker reports a collective timeout (or on any failure with
// --dump-on-hang), every rank is asked to dump its flight recorder through the job's store,
// the dumps are gathered into the attempt's log directory, and `tessel-trace analyze` gives the
// verdict.
//
// The protocol on the store is the flight recorder's (flight_recorder/dumper.h): the launcher
// posts request n with initiator -1; every rank's DumpCoordinator (collectives/dump_coordinator.h)
// dumps and publishes its JSON under store_dump_key(n, rank).
// A worker signals a collective timeout by exiting with kCollectiveTimeoutExitCode.

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/launcher/job_files.h"

namespace tessel {
class Store;
}

namespace tessel::launcher {

inline constexpr int kCollectiveTimeoutExitCode = 124;

// A collective failure as the failing rank stamped it (flight_recorder/dumper.h,
// store_failure_key).
struct CollectiveFailure {
  int rank = -1;
  int64_t wall_time_us = 0;
  std::string reason;
};

// A worker's exit as its agent recorded it.
struct WorkerExitRecord {
  fr::ExitRecord exit;
  int pid = 0, local_rank = -1;
  std::string host;
};

// Asks ranks for dumps and fetches them. The seam between the launcher and whatever carries
// dumps (the job store; a fake in tests). Implementations are thread-safe.
class DumpChannel {
 public:
  virtual ~DumpChannel() = default;
  // Asks every rank to dump now. Does not wait.
  virtual void request_dumps(int64_t round, const std::string& reason) = 0;
  // Rank's dump, waiting up to `timeout`; nullopt when it did not come.
  virtual std::optional<std::string> fetch_dump(int rank, Nanoseconds timeout) = 0;
  // How the rank's process ended in `round`, when its agent has said so (it will never answer).
  virtual std::optional<WorkerExitRecord> exit_of(int64_t /*round*/, int /*rank*/) {
    return std::nullopt;
  }
  // The dump a dead rank left on its node (its fatal-signal dump), posted by its agent.
  virtual std::optional<std::string> final_dump(int /*rank*/) { return std::nullopt; }
  // The pid the rank announced when it began answering dump requests (store_ready_key).
  virtual std::optional<int> pid_of(int /*rank*/) { return std::nullopt; }
  // The rank's first collective failure, by its own clock.
  virtual std::optional<CollectiveFailure> failure_of(int /*rank*/) { return std::nullopt; }
  // Forgets the ranks' failure records and final dumps once a round's have been read, so the
  // next round (after a restart) starts clean.
  virtual void clear_failures(int /*world_size*/) {}
};

// DumpChannel over a Store with the keys above. Shares ownership of the store.
class StoreDumpChannel final : public DumpChannel {
 public:
  explicit StoreDumpChannel(std::shared_ptr<Store> store);
  void request_dumps(int64_t round, const std::string& reason) override;
  // The rank's answer to the latest request_dumps().
  std::optional<std::string> fetch_dump(int rank, Nanoseconds timeout) override;
  std::optional<WorkerExitRecord> exit_of(int64_t round, int rank) override;
  std::optional<std::string> final_dump(int rank) override;
  std::optional<int> pid_of(int rank) override;
  std::optional<CollectiveFailure> failure_of(int rank) override;
  void clear_failures(int world_size) override;

 private:
  std::shared_ptr<Store> store_;
  std::atomic<int64_t> request_{0};  // number of the latest request
};

// The agent's side: records each worker's exit in the job's store (store_exit_key) with, for a
// worker that died, the dump it left in the job's dump folder (its fatal-signal dump), else its
// ring recovered into one (job_files.h), and tells whether any rank of the job answers dump
// requests (it runs tessel's collectives). Thread-compatible; shares the store.
class WorkerExitLog {
 public:
  WorkerExitLog(std::shared_ptr<Store> store, JobRecorderFiles files);
  // Never throws: a store that is gone only costs the record (logged).
  void record(int64_t round, int rank, int local_rank, int pid, int exit_code, int signal);
  bool dump_responders(int world_size);

 private:
  std::shared_ptr<Store> store_;
  JobRecorderFiles files_;
};

// "tessel/run/exit/<round>/<rank>": "<exit_code> <signal> <wall_time_us> <pid> <local_rank>
// <host>".
std::string store_exit_key(int64_t round, int rank);

// What the launcher takes from `tessel-trace analyze --json-out` (the analyzer's verdict).
struct VerdictFacts {
  std::string status;       // "culprit_found", "inconclusive", "healthy"
  std::string status_line;  // "CULPRIT FOUND: rank 1", "INCONCLUSIVE", "HEALTHY"
  std::vector<int> culprits, suspects;
  std::vector<std::string> evidence;    // the first finding's summary and details, or the
                                        // reasons the evidence was not enough
  std::map<int, std::string> where;     // rank -> "in_compute", "crashed", "late", ...
  std::map<int, std::string> position;  // rank -> where it is, in words
};
// Parses the analyzer's verdict JSON (verdict_to_json). Throws InvalidArgument naming `name`.
VerdictFacts parse_verdict_facts(std::string_view json, const std::string& name);

struct HangReport {
  std::string dump_dir;
  std::vector<int> gathered;  // ranks whose dump was written to dump_dir/tessel_fr_rank<r>.json
  std::vector<int> missing;   // ranks that did not answer in time
  std::map<int, int> missing_pids;          // their pids, where they announced one
  std::vector<WorkerExitRecord> exits;      // ranks known to have ended (written to exits.json)
  std::vector<CollectiveFailure> failures;  // every rank's first failed collective, by time
  int trace_status = -1;              // exit status of `tessel-trace analyze`; -1 when not run
  std::string verdict;                // its output, or why it did not run
  std::optional<VerdictFacts> facts;  // the verdict it wrote (dump_dir/verdict.json)
};
// "1 (culprit found)": an exit status of `tessel-trace analyze` in words.
std::string trace_status_text(int status);

// Requests dumps from ranks [0, world_size) and writes each to dump_dir/tessel_fr_rank<r>.json
// within `timeout` overall, never waiting for a rank known to have ended in `round` (its
// agent's final dump is used when there is one; the exits go to dump_dir/exits.json); ranks
// that have not answered after a few seconds are named in the log with the time left. Then runs
// `<trace_tool> analyze dump_dir --json-out dump_dir/verdict.json` (bounded by 60 s), keeps its
// output as the verdict and the JSON as facts, and finds the first collective failure by the
// workers' own clocks. Throws IoError when dump_dir cannot be written.
HangReport gather_flight_recorder_dumps(DumpChannel& channel, int world_size, int64_t round,
                                        const std::string& reason, const std::string& dump_dir,
                                        Nanoseconds timeout, const std::string& trace_tool);

// Runs argv (argv[0] searched on PATH), capturing stdout+stderr, killing it after `timeout`.
// Returns (exit status or 128+signal, output). Throws IoError when it cannot be started.
std::pair<int, std::string> run_capture(const std::vector<std::string>& argv, Nanoseconds timeout);

}  // namespace tessel::launcher
