#pragma once
// The node agent behind tessel-run: joins the rendezvous (hosting it when this node is the
// endpoint, or under --standalone), spawns this node's workers with torchrun's environment,
// supervises them, reports failures and completion, follows the server's events (restart,
// success, failure) and restarts the workers for each new round.
//
//   const int signal_fd = block_agent_signals();   // in main(), before any thread
//   NodeAgent agent(options, signal_fd);
//   AgentResult r = agent.run();                    // print r.report, exit r.exit_status
//
// Not thread-safe: run() is called once, from the main thread (the thread that spawns workers
// must live as long as they do: their parent-death signal follows it).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/launcher/options.h"
#include "tessel/launcher/proto/rendezvous.pb.h"

namespace tessel::launcher {

struct AgentResult {
  int exit_status = 0;
  std::string report;   // failure report or error text for main() to print (empty on success)
  std::string log_dir;  // where this node's logs are
};

// torchrun's worker environment for one worker (the variables tessel-run sets; the caller
// merges them over the inherited environment). Pure, for tests.
std::map<std::string, std::string> worker_environment(const LaunchOptions& options,
                                                      const proto::JoinResponse& round,
                                                      int local_rank);

class NodeAgent {
 public:
  NodeAgent(LaunchOptions options, int signal_fd);
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Runs the job to its end. Launcher errors (unreachable endpoint, missing program, refused
  // token, ...) come back as their documented exit status with a message, not as exceptions.
  AgentResult run();

 private:
  AgentResult run_guarded();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// tessel-run --rdzv-server: serves the rendezvous (and store) at --rdzv-endpoint until the job
// finishes or a signal arrives; returns the job's status like an agent would.
AgentResult run_rendezvous_server(const LaunchOptions& options, int signal_fd);

}  // namespace tessel::launcher
