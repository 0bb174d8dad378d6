#pragma once
// The root cause of a failed round once the hang path has run: one story for the console line,
// failure.json and tessel-run's exit status.
//
// The first failure reported to the server is only the first worker reaped: on a hang that is
// usually a rank whose collective timed out (a victim), not the rank that stopped taking part.
// When the flight recorder's verdict names culprits, the root cause is its first culprit, with
// the verdict's evidence; the first failure in time is kept as the symptom. Without a verdict
// that names anyone (healthy, inconclusive, not run), the workers' own records decide as before:
// a rank killed by a signal, else the rank whose collective timed out first by its own clock.

#include <optional>

#include "tessel/launcher/hang_dump.h"
#include "tessel/launcher/proto/rendezvous.pb.h"

namespace tessel::launcher {

// The round's root cause after the hang path, or nullopt when `reported` (the first failure the
// server got) stays it. Reads the culprit's dump in report.dump_dir for its host and pid when no
// exit record has them. Never throws.
//
// The exit status of a verdict's culprit (root_cause_exit_status): 128 + its signal when one
// killed it, its exit code when it exited non-zero, 124 (kCollectiveTimeoutExitCode) when it was
// alive and did not take part (a hang), 1 when it exited 0 too early.
std::optional<proto::Failure> hang_root_cause(const proto::Failure& reported,
                                              const HangReport& report);

}  // namespace tessel::launcher
