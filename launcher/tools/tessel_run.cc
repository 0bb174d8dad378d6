// tessel-run: start and supervise a distributed job. See docs/launching.md.
#include <grpc/support/log.h>
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/launcher/agent.h"
#include "tessel/launcher/options.h"
#include "tessel/launcher/worker_group.h"

int main(int argc, char** argv) {
  using namespace tessel::launcher;
  ParseResult parsed = parse_launch_options(argc, argv, current_environment());
  if (!parsed.options) {
    std::fputs(parsed.message.c_str(), parsed.exit_status == 0 ? stdout : stderr);
    if (!parsed.message.empty() && parsed.message.back() != '\n') {
      std::fputc('\n', parsed.exit_status == 0 ? stdout : stderr);
    }
    return parsed.exit_status;
  }
  try {
    tessel::init_logging();
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "tessel-run: %s\n", e.what());
    return exit_status(ExitCode::kInvalidConfig);
  }
  tessel::set_log_rank(-1);
  // gRPC's own log lines are internals: shown only with TESSEL_LOGS=launcher=debug.
  gpr_set_log_function([](gpr_log_func_args* args) {
    tessel::log_debug(tessel::LogComponent::kLauncher, "grpc: {}", args->message);
  });
  // A server holds two descriptors per connection (connection_gate.h): use what we may.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  int signal_fd = -1;
  try {
    signal_fd = block_agent_signals();  // before any thread: all inherit the mask
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "tessel-run: %s\n", e.what());
    return exit_status(ExitCode::kInternal);
  }
  AgentResult result;
  if (parsed.options->rdzv_server_only) {
    result = run_rendezvous_server(*parsed.options, signal_fd);
  } else {
    NodeAgent agent(*parsed.options, signal_fd);
    result = agent.run();
  }
  if (!result.report.empty()) std::fputs(result.report.c_str(), stderr);
  return result.exit_status;
}
