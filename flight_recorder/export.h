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

// Chrome trace JSON: one process track per rank ("rank 3 (host)"); inside it a "compute" thread
// track with a complete ("X") slice per span (FlightRecorder::begin_span; spans that overlap
// without nesting spill onto "compute 2", ...), one thread track per group with a slice per
// collective or send/recv, and a "markers" track with an instant ("i") event per user event.
// A slice runs from the entry's start (device-measured where the entry was timed on a device;
// its enqueue time when it never started) to its completion; still-pending ones end at the
// dump and are named "... (pending)". Timestamps are wall-clock microseconds, so ranks line
// up, and a span beside a slice of a group's track shows communication overlapping compute.
std::string export_perfetto(const DumpSet& set);

}  // namespace tessel::fr
