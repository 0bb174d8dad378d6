#pragma once
// Flight-recorder dumps: one versioned JSON file per rank (`tessel_fr_rank<R>.json`), written
// atomically (a temporary file in the same directory, then rename), so a reader never sees half
// a dump. The schema is documented in docs/flight-recorder.md; kDumpFormatVersion changes with it.
//
//   write_dump(FlightRecorder::global(), {DumpTrigger::kApi, -1, "before checkpoint"}, dir);

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "tessel/flight_recorder/recorder.h"

namespace tessel::fr {

inline constexpr std::string_view kDumpFormatName = "tessel-flight-recorder";
// Version 2 added the "split" op, version 3 the "user_span" op, version 4 the job's "run_id";
// the reader also reads versions 1 to 3 (whose fields are a subset; their run id reads as "").
inline constexpr int kDumpFormatVersion = 4;
inline constexpr int kOldestDumpFormatVersion = 1;

// Why a dump was written.
enum class DumpTrigger : uint8_t {
  kApi,           // the program asked (Dumper::dump_now / write_dump)
  kTimeout,       // this rank's watchdog saw a collective time out
  kStoreRequest,  // another rank asked every rank to dump, through the store
  kSignal,        // the dump signal (TESSEL_FR_DUMP_SIGNAL, default SIGUSR1)
  kError,         // a collective failed
  kFatalSignal,   // SIGSEGV, SIGABRT, SIGBUS or SIGFPE; the process dies right after
  kRecovered,     // written after the fact from a ring file (tessel-trace recover)
};
std::string_view trigger_name(DumpTrigger trigger);  // "api", "timeout", "store_request", ...
std::optional<DumpTrigger> parse_trigger(std::string_view name);

// The trigger, the rank whose event caused the dump (-1 when none, e.g. a signal) and a short
// free-text reason ("all_reduce on group 'dp' seq 42 timed out after 30s").
struct DumpRequest {
  DumpTrigger trigger = DumpTrigger::kApi;
  int initiator = -1;
  std::string reason;
};

// "tessel_fr_rank3.json"; "tessel_fr_pid<PID>.json" when the rank is unknown (< 0).
std::string dump_file_name(int rank, int pid);

// The dump as JSON text. Thread-safe; never blocks recorders. May allocate.
std::string dump_to_string(const FlightRecorder& recorder, const DumpRequest& request);

// Writes the dump to `dir`/dump_file_name(...) atomically, creating `dir` if needed, and returns
// the path. Throws IoError naming the path and the system error. Thread-safe.
std::filesystem::path write_dump(const FlightRecorder& recorder, const DumpRequest& request,
                                 const std::filesystem::path& dir);

}  // namespace tessel::fr
