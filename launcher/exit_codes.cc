#include "tessel/launcher/exit_codes.h"

namespace tessel::launcher {

std::string_view exit_code_name(ExitCode code) {
  switch (code) {
    case ExitCode::kSuccess:
      return "success";
    case ExitCode::kUsage:
      return "usage";
    case ExitCode::kInvalidConfig:
      return "invalid-config";
    case ExitCode::kRendezvousUnreachable:
      return "rendezvous-unreachable";
    case ExitCode::kInternal:
      return "internal";
    case ExitCode::kRendezvousTimeout:
      return "rendezvous-timeout";
    case ExitCode::kNodeExcluded:
      return "node-excluded";
    case ExitCode::kUnauthenticated:
      return "unauthenticated";
    case ExitCode::kProgramNotExecutable:
      return "program-not-executable";
    case ExitCode::kProgramNotFound:
      return "program-not-found";
  }
  return "unknown";
}

}  // namespace tessel::launcher
