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

#include <chrono>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/base/clock.h"

namespace tessel {
class Store;
}

namespace tessel::launcher {

inline constexpr int kCollectiveTimeoutExitCode = 124;

// Asks ranks for dumps and fetches them. The seam between the launcher and whatever carries
// dumps (the job store; a fake in tests). Implementations are thread-safe.
class DumpChannel {
 public:
  virtual ~DumpChannel() = default;
  // Asks every rank to dump now. Does not wait.
  virtual void request_dumps(int64_t round, const std::string& reason) = 0;
  // Rank's dump, waiting up to `timeout`; nullopt when it did not come.
  virtual std::optional<std::string> fetch_dump(int rank, Nanoseconds timeout) = 0;
};

// DumpChannel over a Store with the keys above. Shares ownership of the store.
class StoreDumpChannel final : public DumpChannel {
 public:
  explicit StoreDumpChannel(std::shared_ptr<Store> store);
  void request_dumps(int64_t round, const std::string& reason) override;
  // The rank's answer to the latest request_dumps().
  std::optional<std::string> fetch_dump(int rank, Nanoseconds timeout) override;

 private:
  std::shared_ptr<Store> store_;
  std::atomic<int64_t> request_{0};  // number of the latest request
};

struct HangReport {
  std::string dump_dir;
  std::vector<int> gathered;  // ranks whose dump was written to dump_dir/tessel_fr_rank<r>.json
  std::vector<int> missing;   // ranks that did not answer in time
  int trace_status = -1;      // exit status of `tessel-trace analyze`; -1 when not run
  std::string verdict;        // its output, or why it did not run
};

// Requests dumps from ranks [0, world_size), writes each to dump_dir/tessel_fr_rank<r>.json within
// `timeout` overall, then runs `<trace_tool> analyze dump_dir` (bounded by 60 s) and keeps
// its output as the verdict. Throws IoError when dump_dir cannot be written.
HangReport gather_flight_recorder_dumps(DumpChannel& channel, int world_size, int64_t round,
                                        const std::string& reason, const std::string& dump_dir,
                                        Nanoseconds timeout, const std::string& trace_tool);

// Runs argv (argv[0] searched on PATH), capturing stdout+stderr, killing it after `timeout`.
// Returns (exit status or 128+signal, output). Throws IoError when it cannot be started.
std::pair<int, std::string> run_capture(const std::vector<std::string>& argv,
                                        Nanoseconds timeout);

}  // namespace tessel::launcher
