#include "tessel/launcher/exec_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "tessel/base/env.h"
#include "tessel/base/logging.h"

namespace tessel::launcher {
namespace {

bool executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string program_search_path() {
  const char* path = std::getenv("PATH");
  return path ? path : kDefaultProgramPath;
}

std::string resolve_program(const std::string& program, const std::string& path_env) {
  if (program.find('/') != std::string::npos) {
    struct stat st {};
    if (stat(program.c_str(), &st) != 0) {
      throw ProgramError(fmt::format("program '{}' does not exist", program), 127);
    }
    if (!executable_file(program)) {
      throw ProgramError(fmt::format("program '{}' is not an executable file", program), 126);
    }
    return program;
  }
  size_t start = 0;
  while (start <= path_env.size()) {
    const size_t colon = std::min(path_env.find(':', start), path_env.size());
    const std::string dir =
        colon > start ? path_env.substr(start, colon - start) : std::string(".");
    const std::string candidate = dir + "/" + program;
    if (executable_file(candidate)) return candidate;
    start = colon + 1;
  }
  throw ProgramError(fmt::format("program '{}' not found on PATH ({})", program, path_env), 127);
}

std::string find_program(const std::string& program) {
  return resolve_program(program, program_search_path());
}

std::pair<std::string, std::vector<std::string>> program_command(const LaunchOptions& o) {
  const bool py_file = o.program.size() > 3 && o.program.ends_with(".py");
  const bool python = o.module || o.run_path || (py_file && !o.no_python);
  if (!python) return {find_program(o.program), o.program_args};
  std::string interpreter;
  try {
    interpreter = find_program(env_string(EnvKnob::kPython));
  } catch (const ProgramError& e) {
    throw ProgramError(fmt::format("{} runs with Python, but {} (TESSEL_PYTHON; --no-python "
                                   "runs it directly)",
                                   o.program, e.message()),
                       e.exit_status());
  }
  std::vector<std::string> args = {"-u"};
  if (o.module) {
    args.insert(args.end(), {"-m", o.program});
  } else {
    struct stat st {};
    if (stat(o.program.c_str(), &st) != 0) {
      throw ProgramError(fmt::format("program '{}' does not exist", o.program), 127);
    }
    if (o.run_path) {
      args.insert(args.end(), {"-c",
                               "import runpy, sys; sys.argv = sys.argv[1:]; "
                               "runpy.run_path(sys.argv[0], run_name='__main__')"});
    }
    args.push_back(o.program);
  }
  args.insert(args.end(), o.program_args.begin(), o.program_args.end());
  return {interpreter, args};
}

std::string find_trace_tool(const std::string& tool) {
  try {
    return find_program(tool);
  } catch (const ProgramError&) {
  }
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0 || tool.find('/') != std::string::npos) return tool;
  std::string dir(self, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  for (const std::string& candidate : {dir + "/" + tool, dir + "/../flight_recorder/" + tool}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return tool;
}

}  // namespace tessel::launcher
