#pragma once
// How tessel-run finds the programs it starts: one PATH search (resolve_program, over
// program_search_path()), the command line that starts the user's program (directly or with
// Python, as torchrun does), and where the trace tool for a hang's verdict is.
//
//   const std::string sh = find_program("sh");  // "/usr/bin/sh", or throws ProgramError (127)
//
// Reads the environment (PATH, TESSEL_PYTHON) and the file system; no state, thread-safe.

#include <string>
#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/launcher/options.h"

namespace tessel::launcher {

// PROGRAM could not be started. exit_status is 127 (not found) or 126 (not executable).
class ProgramError : public InvalidArgument {
 public:
  ProgramError(const std::string& message, int exit_status)
      : InvalidArgument(message), exit_status_(exit_status) {}
  int exit_status() const { return exit_status_; }

 private:
  int exit_status_;
};

// The search list when PATH is unset (a set but empty PATH is kept: it means the current
// directory, as for execvp).
inline constexpr const char* kDefaultProgramPath = "/usr/bin:/bin";

// PATH, or kDefaultProgramPath when PATH is unset.
std::string program_search_path();

// The absolute path execve will run: PROGRAM itself when it contains '/', else the first
// executable match in the colon-separated PATH_ENV (an empty entry is the current directory).
// Throws ProgramError naming the program (and PATH_ENV).
std::string resolve_program(const std::string& program, const std::string& path_env);

// resolve_program over program_search_path(): the one PATH search tessel-run does.
std::string find_program(const std::string& program);

// How the job's program is started: itself, or with the Python interpreter (TESSEL_PYTHON) as
// torchrun does (.py files, -m modules, --run-path scripts; -u for unbuffered output). Returns
// the resolved executable and its arguments. Throws ProgramError (127/126).
std::pair<std::string, std::vector<std::string>> program_command(const LaunchOptions& options);

// The trace tool to run: as given when it names a path or is on PATH; the default
// `tessel-trace` is also looked for beside tessel-run (installed layout) and in the build
// tree's flight_recorder/ folder. Returns TOOL unchanged when none is found (running it then
// reports the failure).
std::string find_trace_tool(const std::string& tool);

}  // namespace tessel::launcher
