#pragma once
// tessel-run's exit statuses. A job that ran exits with its root cause's status (the worker's
// exit code, or 128 + signal number); the launcher's own failures use the distinct codes below,
// documented in docs/launching.md.

#include <string_view>

namespace tessel::launcher {

enum class ExitCode : int {
  kSuccess = 0,
  kUsage = 64,                  // unknown flag, missing program, malformed flag syntax
  kInvalidConfig = 65,          // a flag value that cannot work: --nnodes 3:2, --nproc-per-node 0
  kRendezvousUnreachable = 69,  // the rendezvous endpoint did not answer after bounded retries
  kInternal = 70,               // a bug or an unexpected system failure in the launcher
  kRendezvousTimeout = 75,      // the round did not form before --rdzv-timeout
  kNodeExcluded = 76,           // this node was taken out of the job (--exclude-culprits)
  kUnauthenticated = 77,        // no token, or the server refused ours
  kProgramNotExecutable = 126,  // PROGRAM exists but cannot be executed
  kProgramNotFound = 127,       // PROGRAM is not a file and not found on PATH
};

inline constexpr int exit_status(ExitCode code) { return static_cast<int>(code); }

// "usage", "invalid-config", ... for messages and the docs table.
std::string_view exit_code_name(ExitCode code);

// Exit status a shell reports for a worker: its exit code, or 128 + the signal number.
inline constexpr int worker_exit_status(int exit_code, int signal) {
  return signal != 0 ? 128 + signal : exit_code;
}

}  // namespace tessel::launcher
