#pragma once
// Dumper: decides when the flight recorder is written to disk and does the writing, off the
// caller's thread. It owns one background thread (the dumper thread) and the process's dump
// signal handlers:
//   - request_dump(): the API; also what the watchdog (notify_timeout) and the collectives
//     layer (notify_store_request) call. Returns at once; the dumper thread writes the file.
//   - dump_now(): the same, synchronously, on the caller's thread.
//   - the dump signal (TESSEL_FR_DUMP_SIGNAL, default SIGUSR1): the handler only wakes the thread.
//   - fatal signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE): the handler writes the dump itself with
//     the async-signal-safe formatter (no allocation, no locks), then re-raises the signal.
// Nothing here touches a communicator, so a dump never waits on one.
//
//   Dumper dumper(FlightRecorder::global(), DumperOptions::from_env());
//   dumper.start();
//   ...
//   dumper.notify_timeout(rank, "all_reduce on 'dp' seq 42 timed out after 30s");
//
// Thread-safe: every public method may be called from any thread. At most one started Dumper
// per process owns the signal handlers (start() of a second one throws). The Dumper must not
// outlive its recorder.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>

#include "tessel/base/mutex.h"
#include "tessel/base/unique_fd.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel::fr {

struct DumperOptions {
  std::filesystem::path dir = "/tmp/tessel_fr";  // where tessel_fr_rank<R>.json goes
  int dump_signal = 0;                           // signal number that triggers a dump; 0 = none
  bool dump_on_fatal = false;                    // install the fatal-signal handlers

  // dir = job_dump_dir(run_id) (run_id.h: TESSEL_FR_DUMP_DIR when set, else
  // /tmp/tessel_fr/<run id>), dump_signal from TESSEL_FR_DUMP_SIGNAL ("SIGUSR1", "USR2", "12",
  // "none"), dump_on_fatal from TESSEL_FR_DUMP_ON_FATAL. Throws InvalidArgument naming the
  // variable on a bad value.
  static DumperOptions from_env(std::string_view run_id = {});
};

// Parses a signal name or number ("SIGUSR1", "usr1", "10"); 0 for "none"/"0"/"off". Throws
// InvalidArgument naming the text and the accepted names.
int parse_signal(std::string_view text);

// Dump requests through the job's store (the collectives layer and the launcher speak this):
//   requester:  n = store.add(kStoreDumpCounterKey, 1); store.set(store_dump_request_key(n), v)
//               with v = encode_store_dump_request(initiator rank or -1 for the launcher, reason)
//   every rank: waits for store_dump_request_key(seen + 1), dumps, and publishes the dump's JSON
//               under store_dump_key(n, rank)
// The collectives layer (collectives/dump_coordinator.h) and the launcher do this; the flight
// recorder itself never touches a store.
inline constexpr std::string_view kStoreDumpCounterKey = "tessel/fr/dump_requests";
std::string store_dump_request_key(int64_t n);    // "tessel/fr/dump_request/<n>"
std::string store_dump_key(int64_t n, int rank);  // "tessel/fr/dump/<n>/<rank>"
// What a launcher reads besides the dumps:
//   store_ready_key(rank)   a rank's coordinator answers dump requests (value: its pid)
//   store_failure_key(rank) the rank's first failed collective, by its own clock:
//                           "<wall_time_us> <reason>" (encode_store_failure)
//   store_final_dump_key(rank)  a dead rank's dump file, posted by its launcher
std::string store_ready_key(int rank);       // "tessel/fr/ready/<rank>"
std::string store_failure_key(int rank);     // "tessel/fr/failure/<rank>"
std::string store_final_dump_key(int rank);  // "tessel/fr/final/<rank>"
std::string encode_store_failure(int64_t wall_time_us, std::string_view reason);
// (wall_time_us, reason); throws InvalidArgument naming the value when it is malformed.
std::pair<int64_t, std::string> decode_store_failure(std::string_view value);
std::string encode_store_dump_request(int initiator, std::string_view reason);
// Throws InvalidArgument naming the text when it is not an encoded request.
DumpRequest decode_store_dump_request(std::string_view value);

class Dumper {
 public:
  Dumper(FlightRecorder& recorder, DumperOptions options);
  ~Dumper();  // stop()
  Dumper(const Dumper&) = delete;
  Dumper& operator=(const Dumper&) = delete;

  // Starts the dumper thread and installs the configured signal handlers. Call it after
  // recorder.set_process_info(): the fatal-signal handler's file name (with the rank) is fixed
  // here, since the handler may not allocate. Throws
  // InvalidArgument when another Dumper in the process is started, IoError when the wake pipe
  // cannot be made. Idempotent.
  void start();
  // Restores the previous signal handlers, writes any requested dump still queued, joins the
  // thread. Idempotent; waits at most for the dump in progress.
  void stop();

  // Asks the dumper thread to write a dump; never blocks on I/O. Requests that arrive while a
  // dump is queued are folded into it (the first request's trigger and initiator are kept).
  // Before start() or after stop(), writes synchronously instead.
  void request_dump(DumpRequest request);
  // Writes a dump on the calling thread and returns its path. Throws IoError.
  std::filesystem::path dump_now(const DumpRequest& request);

  // For the watchdog: a collective of this rank (`rank`) timed out. Asynchronous.
  void notify_timeout(int rank, std::string_view reason) {
    request_dump({DumpTrigger::kTimeout, rank, std::string(reason)});
  }
  // For the collectives layer: it saw `value` under a store_dump_request_key. Asynchronous.
  // Throws InvalidArgument when the value is not an encoded request.
  void notify_store_request(std::string_view value) {
    DumpRequest r = decode_store_dump_request(value);
    r.trigger = DumpTrigger::kStoreRequest;
    request_dump(std::move(r));
  }

  // Dumps written so far (by any trigger except fatal signals), and waiting for a count.
  uint64_t dumps_written() const;
  // True once dumps_written() >= count; false when `timeout` passes first.
  bool wait_for_dumps(uint64_t count, std::chrono::nanoseconds timeout) const;
  // The last failed dump's error message ("" when none failed).
  std::string last_error() const;
  const std::filesystem::path& dir() const { return options_.dir; }

 private:
  void run();
  void write_one(const DumpRequest& request);
  void install_signal_handlers();
  void restore_signal_handlers();

  FlightRecorder& recorder_;
  const DumperOptions options_;
  mutable Mutex mutex_;
  mutable std::condition_variable_any written_cv_;
  std::deque<DumpRequest> queue_ TESSEL_GUARDED_BY(mutex_);
  uint64_t written_ TESSEL_GUARDED_BY(mutex_) = 0;
  std::string last_error_ TESSEL_GUARDED_BY(mutex_);
  bool running_ TESSEL_GUARDED_BY(mutex_) = false;
  bool stopping_ TESSEL_GUARDED_BY(mutex_) = false;
  UniqueFd wake_read_;   // the dumper thread polls this end
  UniqueFd wake_write_;  // request_dump and the signal handler write a byte here
  std::thread thread_;
};

}  // namespace tessel::fr
