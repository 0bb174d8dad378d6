#pragma once
// DumpCoordinator: when one rank's collective times out (or the launcher asks), every live rank
// dumps its flight recorder, through the job's store (protocol in flight_recorder/dumper.h):
// requests are numbered by a store counter; each rank long-polls for the next request, writes
// its dump file and publishes the dump's JSON under store_dump_key(n, rank) for the launcher.
//
// Thread-safety: all methods are thread-safe. Owns one watcher thread (start() / stop(), joined by
// the destructor). on_timeout() never touches the store or a communicator: the watcher posts the
// request, and on_timeout() waits for that at most DumpCoordinatorOptions::post_bound, so a dead
// store can never block the watchdog for longer.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tessel/base/clock.h"
#include "tessel/flight_recorder/dumper.h"
#include "tessel/store/store.h"

namespace tessel {

struct DumpCoordinatorOptions {
  // Longest a store wait blocks before the watcher checks for stop or a request to post.
  Nanoseconds poll = std::chrono::milliseconds(500);
  // Longest on_timeout() waits for the watcher to post its dump request to the other ranks.
  Nanoseconds post_bound = std::chrono::seconds(3);
};

class DumpCoordinator {
 public:
  // `dumper` must outlive the coordinator; `rank` is this process's world rank.
  DumpCoordinator(std::shared_ptr<Store> store, fr::Dumper& dumper, int rank,
                  DumpCoordinatorOptions options = {});
  ~DumpCoordinator();
  DumpCoordinator(const DumpCoordinator&) = delete;
  DumpCoordinator& operator=(const DumpCoordinator&) = delete;

  // Reads the store's request counter, then starts the watcher: every request made after start()
  // returns is answered, earlier ones are not. Throws what the store throws. Idempotent.
  void start();
  // Stops and joins the watcher (within about one poll, plus posting and answering a request
  // on_timeout() left pending, so a rank exiting after a failed collective still leaves its
  // dump in the store). Idempotent.
  void stop();

  // A collective of this rank failed: dump here now, and ask every rank to dump (the watcher
  // records the failure's time under store_failure_key, posts the request and publishes this
  // rank's answer to it). Returns once the watcher has posted the request (at most
  // DumpCoordinatorOptions::post_bound later: a dead store only delays the failure), so a
  // program that dies of the error right away still leaves the others asked to dump.
  void on_timeout(const std::string& reason);

  // Requests this rank has answered (dumped and published).
  int64_t answered() const { return answered_.load(); }

 private:
  void run(int64_t seen);
  void answer(int64_t n, const std::string& value);

  std::shared_ptr<Store> store_;
  fr::Dumper& dumper_;
  const int rank_;
  const DumpCoordinatorOptions options_;
  std::mutex mutex_;
  std::condition_variable stopping_;     // wakes the watcher's back-off on stop()
  std::optional<std::string> pending_;   // guarded by mutex_: a request to post
  uint64_t posted_ = 0;                  // guarded by mutex_: requests the watcher posted
  bool watching_ = false;                // guarded by mutex_: start() ran and stop() did not
  std::condition_variable posted_cv_;    // signalled when posted_ grows or on stop()
  bool stop_ = false;                    // guarded by mutex_
  std::optional<int64_t> failed_at_us_;  // guarded by mutex_: wall time of the first failure
  bool failure_posted_ = false;          // watcher thread only
  std::atomic<int64_t> answered_{0};
  std::thread thread_;
};

// What init_process_group does for a world of several processes: records the rank and world size
// in the flight recorder, starts the process's Dumper (dump signal, fatal-signal dumps) and a
// DumpCoordinator on the job's store (none when `store` is null: the rank then dumps only on its
// own timeouts and signals), and points the watchdog's dump hook at it. They live until
// static destruction at exit (one process-wide instance, which unhooks the watchdog and stops
// the coordinator, then the dumper); later calls are no-ops.
void enable_flight_recorder_dumps(std::shared_ptr<Store> store, int rank, int world_size);

}  // namespace tessel
