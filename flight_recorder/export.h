#pragma once
// Views of dumps for people and tools: one rank's entries as a text table (tessel-trace show)
// and every rank's entries in the Chrome trace event format (tessel-trace export --perfetto),
// which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// Thread-safe: pure functions.

#include <string>

#include "tessel/flight_recorder/reader.h"

namespace tessel::fr {

// Header lines (rank, host, trigger, groups) then one row per entry, oldest first.
std::string format_dump_table(const RankDump& dump);

// Chrome trace JSON: one process track per rank ("rank 3 (host)"), one thread track per group
// inside it, a complete ("X") slice per collective or send/recv (still-pending ones end at the
// dump and are named "... (pending)"), and an instant ("i") event per user event. Timestamps
// are wall-clock microseconds, so ranks line up.
std::string export_perfetto(const DumpSet& set);

}  // namespace tessel::fr
