#pragma once
// tessel-run's options: torchrun-compatible flags, their PET_* environment defaults, and what
// mpirun or Slurm provide when the launcher runs under them.
//
//   LaunchOptions o = parse_launch_options(argc, argv, current_environment());
//
// Parsing is pure (the environment is passed in) so tests can sweep it.

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessel/launcher/exit_codes.h"
#include "tessel/launcher/log_mux.h"
#include "tessel/store/store_tls.h"

namespace tessel::launcher {

struct LaunchOptions {
  // Topology.
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  bool standalone = false;
  std::string rdzv_endpoint;     // HOST:PORT; empty under --standalone
  std::string rdzv_id = "none";  // TORCHELASTIC_RUN_ID ("none": generated if standalone)
  bool rdzv_id_given = false;
  std::string rdzv_backend = "static";           // accepted; tessel-run has one rendezvous
  std::map<std::string, std::string> rdzv_conf;  // --rdzv-conf key=value,... as given
  int node_rank = -1;                            // -1: assigned by the rendezvous
  std::string master_addr;                       // empty: the address of group rank 0's node
  int master_port = 0;                           // 0: a free port on group rank 0's node
  bool rdzv_server_only = false;                 // --rdzv-server: run only the rendezvous server
  std::string local_addr;                        // --local-addr: this node's worker-facing address
  TlsFiles tls;                                  // --rdzv-tls-cert/-key/-ca (or TESSEL_TLS_*)
  std::optional<bool> is_host;  // --rdzv-conf is_host=: serve the rendezvous or not

  // Supervision.
  int max_restarts = 0;
  std::chrono::milliseconds monitor_interval{100};  // heartbeat interval
  int heartbeat_misses = 5;                         // node lost after interval x misses
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(900)};
  std::chrono::milliseconds rdzv_connect_timeout{std::chrono::seconds(20)};
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(1)};
  std::chrono::milliseconds failure_grace{500};  // SIGTERM -> SIGKILL when a worker failed
  std::chrono::milliseconds signal_grace{std::chrono::seconds(10)};  // after SIGINT/SIGTERM
  bool forward_usr_signals = true;  // SIGUSR1/SIGUSR2 to every worker
  bool dump_on_hang = false;
  std::chrono::milliseconds hang_dump_timeout{std::chrono::seconds(30)};  // wait for rank dumps
  std::string trace_tool = "tessel-trace";  // run as `<tool> analyze DIR`
  // Recovery (docs/launching.md#recovery): take culprit nodes out of the job (default: on
  // with --nnodes MIN:MAX, MIN < MAX), the command run when one is (sh -c, TESSEL_EXCLUDED_*
  // in its environment), and Slurm's drain of it (scontrol, when SLURM_JOB_ID is set).
  bool exclude_culprits = false;
  std::string on_exclude;
  bool drain_excluded = false;
  std::string event_log;  // --event-log: one JSON object per job event, appended

  // Logs.
  std::string log_dir;     // empty: a fresh one under default_log_root()
  bool keep_logs = false;  // keep a default log directory after success
  std::string log_prefix = "[{node}:{rank}]";
  StreamSelection redirects;                        // streams kept off the console
  StreamSelection tee;                              // accepted for torchrun compatibility
  std::optional<std::set<int>> local_ranks_filter;  // console output only from these
  std::string rdzv_token_file;

  // The program and its arguments, and how it is started: .py files, -m modules and
  // --run-path scripts run with the Python interpreter (TESSEL_PYTHON), unless --no-python.
  std::string program;
  std::vector<std::string> program_args;
  bool module = false;           // -m/--module: python -m PROGRAM
  bool no_python = false;        // --no-python: execute PROGRAM itself
  bool run_path = false;         // --run-path: runpy.run_path(PROGRAM)
  std::string role = "default";  // --role: ROLE_NAME

  // One line each for torchrun flags that were given and mean nothing here (printed at start).
  std::vector<std::string> notes;

  // Where values came from, for the start-up log line ("mpirun", "slurm", "flags").
  std::string topology_source = "flags";
};

// What parsing produced: options to run, or text to print and a status to exit with (--help,
// errors).
struct ParseResult {
  std::optional<LaunchOptions> options;
  int exit_status = 0;
  std::string message;  // --help text or the error, for main() to print
};

using Environment = std::map<std::string, std::string>;

// The process environment as a map.
Environment current_environment();

// Parses argv. Flags accept dashes or underscores (--nproc_per_node); unset flags take PET_*
// values from env (PET_NNODES, PET_NPROC_PER_NODE, ...), then what mpirun (OMPI_COMM_WORLD_*)
// or Slurm (SLURM_*) provide, then the defaults shown by --help. Never throws for bad input:
// errors come back with ExitCode::kUsage (syntax) or kInvalidConfig (values that cannot work).
ParseResult parse_launch_options(int argc, const char* const* argv, const Environment& env);

// Where default log directories go: $TMPDIR (or /tmp)/tessel-run-<uid>.
std::string default_log_root(const Environment& env);

// "HOST:PORT" checked and completed: torchrun's default port 29400 when none is given; IPv6
// hosts in brackets. Throws InvalidArgument naming the text.
std::string normalize_endpoint(const std::string& endpoint);

// Parses "N" or "MIN:MAX" into (min, max). Throws InvalidArgument naming the text.
std::pair<int, int> parse_nnodes(const std::string& text);
// Parses torchrun's --redirects/--tee value: "0".."3" (none, stdout, stderr, both).
StreamSelection parse_stream_selection(const std::string& text);

}  // namespace tessel::launcher
