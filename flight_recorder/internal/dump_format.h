#pragma once
// The one dump formatter, shared by the normal writer and the fatal-signal handler: it reads the
// recorder without locks or allocation and writes through a fixed buffer, so it is
// async-signal-safe.

#include <cstddef>

#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/internal/json_sink.h"

namespace tessel::fr::internal {

// Formats the whole dump into `sink`. `reason` is NUL-terminated (may be empty).
void format_dump(const FlightRecorder& recorder, DumpTrigger trigger, int initiator,
                 const char* reason, JsonSink& sink) noexcept;

// Writes the dump to `tmp_path` and renames it to `final_path`. Returns 0 or the errno of the
// failing call. Async-signal-safe: open/write/close/rename/unlink only; `buffer` (>= 256 bytes)
// is the caller's.
int write_dump_file(const FlightRecorder& recorder, DumpTrigger trigger, int initiator,
                    const char* reason, const char* tmp_path, const char* final_path, char* buffer,
                    size_t size) noexcept;

}  // namespace tessel::fr::internal
