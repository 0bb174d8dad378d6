#pragma once
// A test harness that runs ranks as real processes: forks N children, each running fn(rank,
// store_dir) with a fresh shared temporary directory for a FileStore, collects their exit
// statuses until a deadline and SIGKILLs whatever is left, so a hung rank fails the test instead
// of hanging it. Call it before the test process starts threads (fork copies only the caller).

#include <functional>
#include <string>
#include <vector>

#include "tessel/base/clock.h"

namespace tessel::testing {

struct ProcessOutcome {
  int rank = 0;
  bool exited = false;  // exited normally (exit_code valid)
  int exit_code = -1;
  int signal = 0;          // the signal that ended it (0 when it exited)
  bool timed_out = false;  // still running at the deadline and killed by the harness
};

// A child exits 0 when fn returns, 1 when it throws (what() is printed to stderr with the rank).
std::vector<ProcessOutcome> run_processes(
    int count, const std::function<void(int rank, const std::string& store_dir)>& fn,
    Nanoseconds deadline);

// "rank 2: exit 1", "rank 1: signal 9", "rank 0: killed at the deadline".
std::string describe(const ProcessOutcome& outcome);

}  // namespace tessel::testing
