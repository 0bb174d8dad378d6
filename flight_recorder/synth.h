#pragma once
// The synthetic dump generator: simulates a job of N ranks, each with its own real
// FlightRecorder driven through the same API the collectives layer uses (register_group,
// record, started, completed, record_event, set_step), on simulated time, and writes every
// live rank's dump with the real writer. Each scenario injects one fault (or none) into the
// ranks' programs; a small matching engine completes a collective once every member issued it
// with the same arguments and a send/recv once both sides are posted, so hangs, deadlocks and
// mismatches arise from the programs exactly as they would in a job.
//
//   SynthOptions o;
//   o.ranks = 8;
//   o.culprit = 3;
//   synth_write("skip_collective", o, "/tmp/fr_skip");   // then: tessel-trace analyze /tmp/fr_skip
//
// Groups: "world" (id 1, all ranks), "half0"/"half1" (ids 2, 3: the lower and upper half, when
// ranks >= 2) and "pair" (id 4: `culprit` and `partner`). Every step: a user event
// "step <k> begins", compute, an all_reduce on the rank's half, an all_reduce on world (ring_*
// scenarios exchange a send/recv with their ring neighbours before those).
// The mesh_* scenarios lay the ranks out as a (dp, tp) mesh instead, rank = i * tp + j: groups
// "world", "dp" (one per tp coordinate j) and "tp" (one per dp coordinate i), siblings of the
// same name and size as DeviceMesh makes them. Every step: an event, compute, an all_reduce on
// tp, one on dp; a world barrier after the last step.
//
// Not thread-safe: one simulation at a time per process (simulated time is process-global).

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::fr {

struct SynthOptions {
  int ranks = 8;
  int steps = 12;
  int culprit = 1;         // the rank that misbehaves
  int partner = 2;         // the second rank of two-rank faults (deadlock, send_without_recv)
  int tp = 2;              // mesh_* scenarios: ranks laid out as (ranks / tp) x tp, (dp, tp)
  size_t capacity = 4096;  // ring entries per rank ("wrapped" uses a small one regardless)
  uint64_t seed = 1;
};

// The scenario names, in a fixed order.
const std::vector<std::string_view>& synth_scenarios();
// One line saying what a scenario injects.
std::string_view synth_description(std::string_view scenario);

// Runs `scenario` and writes one dump per live rank into `dir` (created; existing dumps of
// the same ranks are replaced). Throws InvalidArgument for an unknown scenario or options that
// do not fit it (e.g. culprit == partner), IoError when a dump cannot be written.
void synth_write(std::string_view scenario, const SynthOptions& options,
                 const std::filesystem::path& dir);

}  // namespace tessel::fr
