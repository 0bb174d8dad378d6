#include "tessel/launcher/agent.h"

#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/launch_env.h"
#include "tessel/base/logging.h"
#include "tessel/launcher/event_log.h"
#include "tessel/launcher/exec_path.h"
#include "tessel/launcher/failure_report.h"
#include "tessel/launcher/hang_dump.h"
#include "tessel/launcher/rendezvous_client.h"
#include "tessel/launcher/rendezvous_server.h"
#include "tessel/launcher/root_cause.h"
#include "tessel/launcher/round_control.h"
#include "tessel/launcher/round_state.h"
#include "tessel/launcher/socket_probe.h"
#include "tessel/launcher/token.h"
#include "tessel/launcher/worker_group.h"
#include "tessel/store/network_interface.h"
#include "tessel/store/store.h"
#include "tessel/store/store_client.h"

extern char** environ;

namespace tessel::launcher {
namespace {

constexpr auto kL = LogComponent::kLauncher;
constexpr auto kRpcTimeout = std::chrono::seconds(5);
// How much longer than the dump gathering a hung job's workers are kept before SIGKILL.
constexpr auto kHangHoldMargin = std::chrono::seconds(5);
constexpr auto kNotifyWait = std::chrono::seconds(5);

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

void make_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) throw_system_error("mkdir " + path, errno);
}

std::string make_log_dir(const LaunchOptions& o) {
  if (!o.log_dir.empty()) {
    make_dir(o.log_dir);
    return o.log_dir;
  }
  const std::string root = default_log_root(current_environment());
  if (mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) throw_system_error("mkdir " + root, errno);
  std::string templ = fmt::format("{}/{}-XXXXXX", root, o.rdzv_id);
  if (mkdtemp(templ.data()) == nullptr) throw_system_error("mkdtemp " + templ, errno);
  return templ;
}

AgentResult error_result(ExitCode code, const std::string& message) {
  return {exit_status(code),
          fmt::format("tessel-run: error ({}): {}\n", exit_code_name(code), message), ""};
}

// What a worker wrote to TORCHELASTIC_ERROR_FILE (torchrun's @record format: {"message":
// {"message": "...", "extraInfo": {"py_callstack": "..."}}}), as a few lines for the report;
// "" when it wrote nothing.
std::string error_file_summary(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return "";
  std::stringstream text;
  text << in.rdbuf();
  const auto last_lines = [](const std::string& t, size_t n) {
    std::vector<std::string> lines;
    std::istringstream s(t);
    for (std::string line; std::getline(s, line);) lines.push_back(line);
    std::string out;
    for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
      out += lines[i] + (i + 1 < lines.size() ? "\n" : "");
    }
    return out;
  };
  try {
    const auto j = nlohmann::json::parse(text.str());
    const auto& m = j.contains("message") ? j["message"] : j;
    if (m.is_string()) return m.get<std::string>();
    std::string out = m.value("message", std::string());
    if (m.contains("extraInfo") && m["extraInfo"].contains("py_callstack")) {
      out += "\n" + last_lines(m["extraInfo"]["py_callstack"].get<std::string>(), 8);
    }
    return out;
  } catch (const std::exception&) {
    return last_lines(text.str(), 8);
  }
}

// A run id for --standalone (torchrun generates one too): 8-4-4-4-12 random hex digits.
std::string generate_run_id() {
  const std::string hex = generate_token();
  return fmt::format("{}-{}-{}-{}-{}", hex.substr(0, 8), hex.substr(8, 4), hex.substr(12, 4),
                     hex.substr(16, 4), hex.substr(20, 12));
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  try {
    return network_route_to(host).interface == "lo";
  } catch (const Error&) {
    return false;
  }
}

// The store client an agent records its workers' exits with, and the job's flight-recorder
// files (their run id shared through that store: job_files.h); null (logged) when the store
// cannot be reached.
std::unique_ptr<WorkerExitLog> make_exit_log(const std::string& endpoint, const std::string& token,
                                             const TlsFiles& tls, const std::string& rdzv_id,
                                             JobRecorderFiles& files) {
  try {
    StoreClientOptions client;
    client.address = endpoint;
    client.token = token;
    client.tls = tls;
    client.connect_timeout = std::chrono::seconds(5);
    client.rpc_timeout = std::chrono::seconds(2);
    auto store = std::make_shared<StoreClient>(client);
    files = job_recorder_files(rdzv_id, store.get());
    return std::make_unique<WorkerExitLog>(std::move(store), files);
  } catch (const Error& e) {
    log_warn(kL, "worker exits will not be recorded for dump gathering: {}", e.message());
    files = job_recorder_files(rdzv_id, nullptr);
    return nullptr;
  }
}

// The hook the server runs on a hang: dumps through the job store, verdict in the log; returns
// the root cause by the workers' own failure times when it is another rank than the first
// report's.
std::function<std::optional<proto::Failure>(const proto::Failure&, int64_t, int)> hang_hook(
    const LaunchOptions& o, std::shared_ptr<std::string> server_address, std::string token,
    std::string log_dir) {
  return [o, server_address, token, log_dir](const proto::Failure& root, int64_t round,
                                             int world_size) -> std::optional<proto::Failure> {
    StoreClientOptions client;
    client.address = *server_address;
    client.token = token;
    client.tls = o.tls;
    client.connect_timeout = std::chrono::seconds(10);
    StoreDumpChannel channel(std::make_shared<StoreClient>(client));
    const std::string dir = fmt::format("{}/flight_recorder_round_{}", log_dir, round);
    HangReport r = gather_flight_recorder_dumps(channel, world_size, round, root.reason(), dir,
                                                o.hang_dump_timeout, find_trace_tool(o.trace_tool));
    if (r.gathered.empty()) {
      log_info(kL, "no rank answered the dump request: no flight-recorder verdict");
    } else if (r.facts && r.facts->status == "healthy") {
      log_info(kL,
               "flight recorder: no rank waits in a collective ({}); the failure is the "
               "worker's own. Dumps: {}",
               r.facts->status_line, dir);
    } else {
      log_warn(kL, "tessel-trace analyze {} (exit {}):\n{}", dir, trace_status_text(r.trace_status),
               r.verdict);
    }
    return hang_root_cause(root, r);
  };
}

RendezvousServerOptions server_options(const LaunchOptions& o, const std::string& bind,
                                       const std::string& token) {
  RendezvousServerOptions s;
  s.bind_address = bind;
  s.token = token;
  s.min_nodes = o.min_nodes;
  s.max_nodes = o.max_nodes;
  s.max_restarts = o.max_restarts;
  s.heartbeat_interval = o.monitor_interval;
  s.heartbeat_misses = o.heartbeat_misses;
  s.last_call_timeout = o.last_call_timeout;
  s.poll_limit = kEventPollLimit;
  s.master_addr = o.master_addr;
  s.master_port = o.master_port;
  s.dump_on_hang = o.dump_on_hang;
  s.tls = o.tls;
  s.host_name = hostname();
  s.exclude_culprits = o.exclude_culprits;
  return s;
}

// Runs a recovery hook (ARGV, with EXTRA "NAME=value" entries added to this environment, the job
// token left out) and waits up to TIMEOUT, then SIGKILL. Returns its exit status, -1 when it
// could not be started. Called between rounds, when no worker runs.
int run_hook(const std::vector<std::string>& argv, const std::vector<std::string>& extra,
             std::chrono::milliseconds timeout) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::string_view(*e).rfind("TESSEL_RDZV_TOKEN=", 0) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawnp(&pid, cargv[0], nullptr, nullptr, cargv.data(), cenv.data()) != 0) return -1;
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  pollfd p{pidfd, POLLIN, 0};
  if (pidfd < 0 || ::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) {
    log_warn(kL, "{} did not end within {}: killed", argv.front(), format_duration(timeout));
    kill(pid, SIGKILL);
  }
  if (pidfd >= 0) ::close(pidfd);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

constexpr auto kHookTimeout = std::chrono::seconds(60);

// Serves the rendezvous (no workers here) until the job ends: a dedicated server's life, and
// that of an agent whose node was taken out while it serves the job. SIGINT/SIGTERM stop the job.
AgentResult serve_until_outcome(RendezvousServer& server, int signal_fd, int max_restarts,
                                const std::string& log_dir) {
  for (;;) {
    JobOutcome outcome = server.wait_outcome(std::chrono::milliseconds(0));
    if (outcome.kind != proto::JobEvent::NONE) {
      server.wait_all_notified(kNotifyWait);
      if (outcome.kind == proto::JobEvent::SUCCEEDED) return {0, "", log_dir};
      return {root_cause_exit_status(outcome.root_cause),
              format_failure_report(outcome.root_cause, outcome.restart_count, max_restarts),
              log_dir};
    }
    // Sleeps only in poll(2) on the signal fd; the outcome is checked between waits.
    pollfd p{signal_fd, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      signalfd_siginfo info{};
      if (::read(signal_fd, &info, sizeof(info)) == sizeof(info) &&
          (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM)) {
        proto::Failure f;
        f.set_rank(-1);
        f.set_host(hostname());
        f.set_signal(static_cast<int>(info.ssi_signo));
        f.set_reason("interrupted");
        server.stop_job(f);
      }
    }
  }
}

// A knob's variable name, from the one table of them (base/env.cc).
std::string knob_name(EnvKnob knob) { return std::string(env_knob_info(knob).name); }

}  // namespace

std::map<std::string, std::string> worker_environment(const LaunchOptions& o,
                                                      const proto::JoinResponse& r,
                                                      int local_rank) {
  const int rank = r.rank_offset() + local_rank;
  std::map<std::string, std::string> env = {
      {launch_env::kRank, std::to_string(rank)},
      {launch_env::kLocalRank, std::to_string(local_rank)},
      {launch_env::kGroupRank, std::to_string(r.group_rank())},
      {launch_env::kRoleRank, std::to_string(rank)},
      {launch_env::kRoleName, o.role},
      {launch_env::kLocalWorldSize, std::to_string(o.nproc_per_node)},
      {launch_env::kWorldSize, std::to_string(r.world_size())},
      {launch_env::kGroupWorldSize, std::to_string(r.group_world_size())},
      {launch_env::kRoleWorldSize, std::to_string(r.world_size())},
      {launch_env::kMasterAddr, r.master_addr()},
      {launch_env::kMasterPort, std::to_string(r.master_port())},
      {launch_env::kRestartCount, std::to_string(r.restart_count())},
      {launch_env::kMaxRestarts, std::to_string(o.max_restarts)},
      {launch_env::kRunId, o.rdzv_id},
      {launch_env::kUseAgentStore, "False"},
  };
  return env;
}

struct NodeAgent::Impl {
  LaunchOptions o;
  int signal_fd;
  int event_fd = -1;
  std::string host = hostname();
  std::string node_id;
  std::string token;
  std::string log_dir;
  std::unique_ptr<OrphanGuard> guard;
  std::unique_ptr<RendezvousServer> server;
  std::unique_ptr<RendezvousClient> client;
  std::unique_ptr<LogMux> mux;
  std::unique_ptr<WorkerGroup> workers;
  std::unique_ptr<WorkerExitLog> exit_log;   // null when the job's store cannot be reached
  JobRecorderFiles fr_files;                 // the job's run id, dump and ring folders
  std::vector<int> ended_ranks, ended_pids;  // every worker reaped: whose rings to remove
  std::string endpoint;
  NetworkRoute route;  // this node's worker-facing address and its interface
  std::string attempt_dir;
  bool default_log_dir = false;  // made by us: removed after success unless --keep-logs
  std::string local_token_dir;   // set when the token is a local one (every node here)
  int local_token_port = 0;
  bool published_token = false;
  std::optional<proto::Failure> last_root_cause;  // of the last failed round, for every exit
  std::unique_ptr<EventLog> events;

  // The closed loop's side effects, run by the agent that serves the rendezvous for each node
  // a failed round took out: the job's record in its store (tessel/excluded_nodes, a JSON
  // array), the user's --on-exclude command and, with --drain-excluded under Slurm, the drain.
  void after_exclusions(const proto::Failure& root) {
    if (!server || root.excluded().empty()) return;
    try {
      StoreClientOptions client;
      client.address = endpoint;
      client.token = token;
      client.tls = o.tls;
      client.connect_timeout = std::chrono::seconds(5);
      client.rpc_timeout = std::chrono::seconds(2);
      nlohmann::json all = nlohmann::json::array();
      for (const proto::Exclusion& x : server->excluded()) {
        all.push_back({{"host", x.host()},
                       {"addr", x.addr()},
                       {"round", x.round()},
                       {"ranks", std::vector<int>(x.ranks().begin(), x.ranks().end())},
                       {"reason", x.reason()},
                       {"agent", x.node_id()}});
      }
      StoreClient(client).set("tessel/excluded_nodes", all.dump());
    } catch (const Error& e) {
      log_warn(kL, "could not record the excluded nodes in the job's store: {}", e.message());
    }
    for (const proto::Exclusion& x : root.excluded()) {
      const std::string ranks = fmt::format("{}", fmt::join(x.ranks(), ","));
      if (!o.on_exclude.empty()) {
        const int status = run_hook(
            {"/bin/sh", "-c", o.on_exclude},
            {"TESSEL_EXCLUDED_HOST=" + x.host(), "TESSEL_EXCLUDED_ADDR=" + x.addr(),
             "TESSEL_EXCLUDED_RANKS=" + ranks, "TESSEL_EXCLUDED_ROUND=" + std::to_string(x.round()),
             "TESSEL_EXCLUDED_REASON=" + x.reason(), "TESSEL_EXCLUDED_AGENT=" + x.node_id()},
            kHookTimeout);
        if (status != 0) log_warn(kL, "--on-exclude for {} exited with {}", x.host(), status);
      }
      const char* slurm_job = std::getenv("SLURM_JOB_ID");
      if (o.drain_excluded && !x.node_id().empty()) {
        // Only that agent was taken out: healthy agents of the job run on the same machine.
        log_warn(kL, "not draining {}: other agents of the job run there (only agent {} is out)",
                 x.host(), x.node_id());
      } else if (o.drain_excluded && slurm_job != nullptr && *slurm_job != '\0') {
        const std::string reason = ("tessel verdict: " + x.reason()).substr(0, 200);
        const int status = run_hook(
            {"scontrol", "update", "nodename=" + x.host(), "state=drain", "reason=" + reason}, {},
            kHookTimeout);
        if (status != 0) {
          log_warn(kL, "scontrol update nodename={} state=drain exited with {}", x.host(), status);
        } else {
          log_info(kL, "drained Slurm node {}: {}", x.host(), reason);
        }
      }
    }
  }

  std::vector<std::string> base_environment() const {
    std::vector<std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      const std::string_view entry(*e);
      if (entry.rfind("TESSEL_RDZV_TOKEN=", 0) == 0) continue;  // workers get the store token
      env.emplace_back(entry);
    }
    return env;
  }

  std::vector<WorkerSpec> specs(const proto::JoinResponse& r) const {
    std::vector<WorkerSpec> out;
    const std::vector<std::string> base = base_environment();
    for (int local = 0; local < o.nproc_per_node; ++local) {
      std::map<std::string, std::string> vars = worker_environment(o, r, local);
      vars[knob_name(EnvKnob::kStoreAddr)] = endpoint;
      vars[knob_name(EnvKnob::kStoreToken)] = token;
      vars["TESSEL_AGENT_ID"] = node_id;
      // One run id and ring folder per job, so dumps and rings of two jobs never mix.
      vars[knob_name(EnvKnob::kFrRunId)] = fr_files.run_id;
      vars[knob_name(EnvKnob::kFrRingDir)] = fr_files.ring_dir;
      vars["TORCHELASTIC_ERROR_FILE"] = error_file(r.rank_offset() + local);
      if (!o.tls.cert.empty()) vars[knob_name(EnvKnob::kTlsCert)] = o.tls.cert;
      if (!o.tls.key.empty()) vars[knob_name(EnvKnob::kTlsKey)] = o.tls.key;
      if (!o.tls.ca.empty()) vars[knob_name(EnvKnob::kTlsCa)] = o.tls.ca;
      WorkerSpec s{local, r.rank_offset() + local, {}};
      std::set<std::string> inherited;
      for (const auto& e : base) {
        const std::string name = e.substr(0, e.find('='));
        if (vars.count(name) != 0) continue;
        inherited.insert(name);
        s.env.push_back(e);
      }
      // torchrun sets OMP_NUM_THREADS=1 for several workers per node unless the user did.
      if (!inherited.count("OMP_NUM_THREADS") && o.nproc_per_node > 1) {
        s.env.push_back("OMP_NUM_THREADS=1");
      }
      // Gloo (ours, and PyTorch's) binds the interface that reaches the rendezvous, unless the
      // user chose one: a host name resolving to 127.0.1.1 must not send peers to loopback.
      if (!route.interface.empty()) {
        if (!inherited.count("TESSEL_GLOO_IFACE"))
          s.env.push_back("TESSEL_GLOO_IFACE=" + route.interface);
        if (!inherited.count("GLOO_SOCKET_IFNAME"))
          s.env.push_back("GLOO_SOCKET_IFNAME=" + route.interface);
      }
      for (const auto& [k, v] : vars) s.env.push_back(k + "=" + v);
      out.push_back(std::move(s));
    }
    return out;
  }

  std::string error_file(int rank) const {
    return fmt::format("{}/rank_{}.error.json", attempt_dir, rank);
  }

  proto::Failure failure_of(const WorkerExit& e, const proto::JoinResponse& r) const {
    proto::Failure f;
    f.set_error_file(error_file_summary(error_file(e.global_rank)));
    f.set_node_id(node_id);
    f.set_host(host);
    f.set_rank(e.global_rank);
    f.set_local_rank(e.local_rank);
    f.set_pid(e.pid);
    f.set_exit_code(e.exit_code);
    f.set_signal(e.signal);
    f.set_reason(e.signal != 0 ? "signal" : "exited");
    f.set_stderr_tail(mux->stderr_tail(e.local_rank));
    f.set_round(r.round());
    f.set_hang(e.signal == 0 && e.exit_code == kCollectiveTimeoutExitCode);
    return f;
  }

  // Supervises one round's workers until the server's event for the round arrives and they
  // are gone. Each thing seen is a transition of the round's state (round_state.h); the I/O it
  // asks for (signals, reports) is done here.
  RoundEnd supervise(const proto::JoinResponse& r, RoundControl& control, proto::JobEvent* out) {
    RoundState round;
    for (;;) {
      if (round.over(workers->running())) {
        workers->kill_all();  // descendants that outlived their worker
        return *round.end();
      }
      WorkerEvents ev = workers->wait(round.kill_deadline());
      for (const WorkerExit& e : ev.exits) {
        // Every exit goes on record, so a gatherer never waits for a rank that is gone.
        if (exit_log) {
          exit_log->record(r.round(), e.global_rank, e.local_rank, e.pid, e.exit_code, e.signal);
        }
        ended_ranks.push_back(e.global_rank);
        ended_pids.push_back(e.pid);
        if (e.success()) continue;
        if (!round.worker_failed()) continue;  // the round is already stopping
        proto::Failure f = failure_of(e, r);
        // A failure in a job whose ranks answer dump requests (it runs tessel's collectives)
        // takes the hang path whatever the exit status: a rank that lost a peer (exit 1) may be
        // reaped before the one whose collective timed out.
        if (!f.hang() && exit_log && exit_log->dump_responders(r.world_size())) f.set_hang(true);
        log_warn(kL, "rank {} (pid {}) failed: {}", e.global_rank, e.pid,
                 e.signal ? signal_name(e.signal) : fmt::format("exit code {}", e.exit_code));
        if (f.hang() || o.dump_on_hang) {
          // Keep the other workers alive: the server first gathers every rank's flight-recorder
          // dump, then ends the round (its event stops them). Bounded in case no event comes.
          round.hold_for_dumps(o.hang_dump_timeout + o.failure_grace + kHangHoldMargin);
        } else {
          workers->signal_all(SIGTERM);  // stop the rest now, without waiting for the server
          round.stop_after_failure(o.failure_grace);
        }
        try {
          client->report_failure(node_id, r.round(), f, kRpcTimeout);
        } catch (const RpcError& err) {
          log_warn(kL, "failure report refused: {}", err.what());
        }
      }
      if (workers->running() == 0 && round.all_workers_exited()) {
        try {
          client->report_done(node_id, r.round(), kRpcTimeout);
        } catch (const RpcError& err) {
          log_warn(kL, "completion report refused: {}", err.what());
        }
      }
      for (int fd : ev.ready_fds) {
        if (fd == signal_fd) {
          signalfd_siginfo info{};
          while (::read(signal_fd, &info, sizeof(info)) == sizeof(info)) {
            const int sig = static_cast<int>(info.ssi_signo);
            if (sig == SIGUSR1 || sig == SIGUSR2) {
              if (o.forward_usr_signals) workers->signal_all(sig);
              continue;
            }
            if (round.interrupted(sig, o.signal_grace) == RoundState::Interrupt::kKillNow) {
              log_warn(kL, "second SIGINT: killing the workers now");
              workers->signal_all(SIGKILL);
              continue;
            }
            log_warn(kL, "{}: forwarding to the workers; SIGKILL in {}", signal_name(sig),
                     format_duration(o.signal_grace));
            workers->signal_all(sig);
            proto::Failure f;
            f.set_node_id(node_id);
            f.set_host(host);
            f.set_rank(-1);
            f.set_signal(sig);
            f.set_reason("interrupted");
            try {
              client->report_failure(node_id, r.round(), f, kRpcTimeout);
            } catch (const RpcError& err) {
              log_warn(kL, "interrupt report refused: {}", err.what());
            }
          }
        } else if (fd == event_fd) {
          uint64_t n = 0;
          (void)!::read(event_fd, &n, sizeof(n));
          while (auto e = control.take()) {
            if (!e->server_lost) *out = e->event;
            server_refused = e->server_lost && e->refused;
            const RoundEnd end = e->server_lost                                ? RoundEnd::kLinkLost
                                 : e->event.kind() == proto::JobEvent::RESTART ? RoundEnd::kRestart
                                                                               : RoundEnd::kFinal;
            if (round.server_decided(end, o.failure_grace)) workers->signal_all(SIGTERM);
          }
        }
      }
      if (round.kill_due()) workers->signal_all(SIGKILL);
    }
  }

  int interrupt_signal = 0;

  // " The last failed round: ..." for exits that are not the job's failure itself.
  std::string root_cause_note() const {
    if (!last_root_cause) return "";
    return "; the job's last failure was " + one_line_root_cause(*last_root_cause);
  }

  AgentResult error_with_cause(ExitCode code, const std::string& message) const {
    AgentResult r = error_result(code, message + root_cause_note());
    r.log_dir = log_dir;
    return r;
  }

  // How join_round ended.
  struct Joined {
    std::optional<proto::JoinResponse> round = std::nullopt;  // joined
    std::optional<proto::JobEvent> finished = std::nullopt;   // the job had ended: its outcome
    std::optional<AgentResult> exit = std::nullopt;  // interrupted, unreachable, timed out...
    bool again = false;  // the job moved to a standby server: join there
  };

  // Joins the next round. The Join waits on a scoped thread; this thread watches the signal
  // fd and pings the server every --monitor-interval: a server that stops answering is
  // reported within the heartbeat bound, and given up after --rdzv-connect-timeout (a link
  // that comes back in time keeps the node in the job). A broken Join is retried.
  Joined join_round(const proto::JoinRequest& join) {
    const auto bound = o.monitor_interval * o.heartbeat_misses;
    const auto started = SteadyClock::now();
    auto last_contact = started;
    bool warned = false;
    for (;;) {
      grpc::ClientContext context;
      std::exception_ptr error;
      proto::JoinResponse response;
      const int done_fd = eventfd(0, EFD_CLOEXEC);
      if (done_fd < 0) throw_system_error("eventfd", errno);
      const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
          o.rdzv_timeout - (SteadyClock::now() - started));
      std::thread joiner([&] {
        try {
          response =
              client->join(join, std::max(remaining, std::chrono::milliseconds(1)), &context);
        } catch (...) {
          error = std::current_exception();
        }
        const uint64_t one = 1;
        (void)!::write(done_fd, &one, sizeof(one));
      });
      bool silent_too_long = false;
      for (;;) {
        pollfd fds[2] = {{done_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
        const int n = ::poll(fds, 2, static_cast<int>(o.monitor_interval.count()));
        if (n < 0 && errno == EINTR) continue;
        if (fds[0].revents != 0) break;
        if (fds[1].revents != 0) {
          signalfd_siginfo info{};
          if (::read(signal_fd, &info, sizeof(info)) == sizeof(info) &&
              (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM || info.ssi_signo == SIGHUP)) {
            interrupt_signal = static_cast<int>(info.ssi_signo);
            context.TryCancel();
          }
          continue;
        }
        if (silent_too_long || interrupt_signal != 0) continue;  // cancelled; joiner ends
        try {
          client->ping(node_id, o.monitor_interval);
          if (warned) log_warn(kL, "rendezvous server {} answers again", endpoint);
          warned = false;
          last_contact = SteadyClock::now();
        } catch (const RpcError&) {
          const auto silent = SteadyClock::now() - last_contact;
          if (silent > bound && !warned) {
            warned = true;
            log_warn(kL,
                     "rendezvous server {} has not answered for {} (the heartbeat bound); "
                     "waiting up to --rdzv-connect-timeout {} for it",
                     endpoint, format_duration(silent), format_duration(o.rdzv_connect_timeout));
          }
          if (silent > o.rdzv_connect_timeout) {
            silent_too_long = true;
            context.TryCancel();
          }
        }
      }
      joiner.join();
      ::close(done_fd);
      if (interrupt_signal != 0) {
        return {.exit = AgentResult{
                    128 + interrupt_signal,
                    fmt::format("tessel-run: {} while waiting for the rendezvous round; no "
                                "workers ran{}\n",
                                signal_name(interrupt_signal), root_cause_note()),
                    log_dir}};
      }
      if (silent_too_long && last_round && !server && o.min_nodes < o.max_nodes &&
          !last_heartbeat.standby_addr().empty()) {
        // The server's node has been silent for --rdzv-connect-timeout (its link cut, the node
        // down): the standby it named takes the job over. If this node is the one cut off, the
        // standby does not answer it either and it ends below, after as long again.
        const std::string why = fmt::format(
            "node lost: the rendezvous server there has not answered for {} "
            "(--rdzv-connect-timeout)",
            format_duration(o.rdzv_connect_timeout));
        if (auto exit = take_over(*last_round, last_heartbeat, why)) return {.exit = *exit};
        return {.again = true};
      }
      if (silent_too_long) {
        return {.exit = error_with_cause(
                    ExitCode::kRendezvousUnreachable,
                    fmt::format("lost the rendezvous server {}: no answer for {} "
                                "(--rdzv-connect-timeout); workers stopped",
                                endpoint, format_duration(o.rdzv_connect_timeout)))};
      }
      if (!error) return {.round = response};
      try {
        std::rethrow_exception(error);
      } catch (const RpcError& e) {
        switch (e.code()) {
          case grpc::StatusCode::FAILED_PRECONDITION: {  // the job ended meanwhile
            grpc::ClientContext outcome;
            return {.finished = client->wait_event(node_id, -1, kRpcTimeout, &outcome)};
          }
          case grpc::StatusCode::ALREADY_EXISTS:
            return {.exit = error_result(ExitCode::kInvalidConfig, e.message())};
          case grpc::StatusCode::PERMISSION_DENIED:  // this node was taken out of the job
            events->node_refused(e.message());
            if (server) {
              log_warn(kL,
                       "this node serves the job's rendezvous: it goes on serving (no "
                       "workers) until the job ends");
              return {.exit = serve_until_outcome(*server, signal_fd, o.max_restarts, log_dir)};
            }
            return {.exit = error_with_cause(ExitCode::kNodeExcluded, e.message())};
          case grpc::StatusCode::UNAUTHENTICATED:
            return {.exit = error_result(ExitCode::kUnauthenticated, e.message())};
          case grpc::StatusCode::DEADLINE_EXCEEDED:
            return {.exit = error_with_cause(
                        ExitCode::kRendezvousTimeout,
                        fmt::format("round did not form within --rdzv-timeout {} ({} nodes "
                                    "wanted)",
                                    format_duration(o.rdzv_timeout),
                                    o.min_nodes == o.max_nodes
                                        ? std::to_string(o.min_nodes)
                                        : fmt::format("{}:{}", o.min_nodes, o.max_nodes)))};
          default:  // the connection broke (ABORTED: replaced by a newer Join): try again
            if (SteadyClock::now() - last_contact > o.rdzv_connect_timeout) {
              return {.exit = error_with_cause(
                          ExitCode::kRendezvousUnreachable,
                          fmt::format("lost the rendezvous server {}: {}", endpoint, e.message()))};
            }
            pollfd p{signal_fd, 0, 0};
            ::poll(&p, 1, static_cast<int>(o.monitor_interval.count()));
        }
      }
    }
  }

  AgentResult final_result(const proto::JobEvent& event) {
    if (server) server->wait_all_notified(kNotifyWait);
    AgentResult result{0, "", log_dir};
    if (event.kind() == proto::JobEvent::SUCCEEDED) {
      events->job_finished("succeeded", 0);
      return result;
    }
    const proto::Failure& root = event.root_cause();
    result.exit_status = root_cause_exit_status(root);
    result.report = format_failure_report(root, event.restart_count(), o.max_restarts);
    try {
      write_failure_report(log_dir + "/failure.json", root, event.restart_count());
      result.report += fmt::format("  report: {}/failure.json\n", log_dir);
    } catch (const Error& e) {
      result.report += fmt::format("  (could not write failure.json: {})\n", e.message());
    }
    events->job_finished(event.kind() == proto::JobEvent::STOP ? "stopped" : "failed",
                         result.exit_status);
    return result;
  }

  // Serves the job's rendezvous (and store) here.
  void start_server(RendezvousServerOptions so) {
    auto server_address = std::make_shared<std::string>();
    so.on_hang = hang_hook(o, server_address, token, log_dir);
    server = std::make_unique<RendezvousServer>(so);
    *server_address = server->address();
  }

  bool server_refused = false;  // the last round's server was lost: its host refused us
  std::optional<proto::JoinResponse> last_round;  // the last round this node ran
  proto::HeartbeatResponse last_heartbeat;        // the server's last answer in it

  // The server's node is gone (its host refused the connection). With --nnodes MIN:MAX and a
  // standby named in the server's heartbeat answers, the job goes on: the standby serves it at
  // its own address (the endpoint's port) with the restarts and exclusions it was told, the
  // others join there. Otherwise the job ends here, naming the lost node. Returns the exit, or
  // nullopt once connected to the new server.
  std::optional<AgentResult> take_over(const proto::JoinResponse& r,
                                       const proto::HeartbeatResponse& hb,
                                       const std::string& reason) {
    proto::Failure cause;
    cause.set_rank(-1);
    cause.set_addr(endpoint_host(endpoint));
    cause.set_host(hb.server_host());
    cause.set_group_rank(r.master_addr() == cause.addr() ? 0 : -1);
    cause.set_round(r.round());
    cause.set_server_time_us(wall_time_us());
    cause.set_reason(reason);
    last_root_cause = cause;
    const bool standby = o.min_nodes < o.max_nodes && !hb.standby_addr().empty() &&
                         o.tls.cert.empty() && o.tls.ca.empty() && local_token_port == 0;
    if (!standby) {
      events->server_lost(cause, "", false);
      return error_with_cause(
          ExitCode::kRendezvousUnreachable,
          fmt::format("lost the rendezvous server {} ({}); {}", endpoint, reason,
                      o.min_nodes < o.max_nodes
                          ? "no standby can take over (TLS, or a job on one host)"
                          : "with a fixed --nnodes the job cannot go on without that node"));
    }
    const std::string addr = hb.standby_addr();
    const std::string next = (addr.find(':') != std::string::npos ? "[" + addr + "]" : addr) +
                             endpoint.substr(endpoint.rfind(':'));
    const bool serving = addr == route.address;
    events->server_lost(cause, next, serving);
    if (serving) {
      RendezvousServerOptions so = server_options(o, next, token);
      so.first_round = r.round() + 1;
      so.restarts_done = hb.restart_count() + 1;
      so.excluded.assign(hb.excluded().begin(), hb.excluded().end());
      so.takeover_cause = cause;
      start_server(so);
    }
    endpoint = next;
    RendezvousClientOptions co;
    co.tls = o.tls;
    client = std::make_unique<RendezvousClient>(endpoint, token, co);
    client->wait_connected(o.rdzv_connect_timeout);
    exit_log = make_exit_log(endpoint, token, o.tls, o.rdzv_id, fr_files);
    return std::nullopt;
  }

  // The token, and whether this agent serves the rendezvous; starts the server if so.
  void start_rendezvous() {
    const auto serve_at = [&](const std::string& bind) {
      this->start_server(server_options(o, bind, token));
    };
    if (o.standalone) {
      token = generate_token();
      serve_at("127.0.0.1:0");
      endpoint = server->address();
      return;
    }
    endpoint = o.rdzv_endpoint;
    const std::string host = endpoint_host(endpoint);
    const bool token_given = !o.rdzv_token_file.empty() || !env_string(EnvKnob::kRdzvToken).empty();
    const bool hosting =
        o.is_host.value_or(endpoint_is_local(endpoint) && !endpoint_in_use(endpoint));
    // Every node on this host (a loopback endpoint), or a one-node job serving itself: no
    // token from the user; the serving agent publishes one for the others on this host.
    const bool local_token =
        !token_given && (is_loopback_host(host) || (o.max_nodes == 1 && hosting));
    token = local_token ? generate_token() : load_token(o.rdzv_token_file);
    if (hosting) {
      try {
        serve_at(endpoint);
      } catch (const CommError& e) {
        if (o.is_host.value_or(false)) throw;
        log_info(kL, "not hosting the rendezvous ({}); joining as a client", e.message());
      }
    }
    if (local_token) {
      local_token_dir = default_log_root(current_environment());
      local_token_port = std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1);
      if (server) {
        publish_local_token(local_token_dir, local_token_port, token);
        published_token = true;
      } else {
        token.clear();  // read from the serving agent's file when connecting
      }
    }
  }

  // Connects to the rendezvous (reading the local token when another agent here publishes it).
  void connect() {
    RendezvousClientOptions co;
    co.tls = o.tls;
    if (token.empty() && local_token_port != 0) {
      const Deadline give_up = Deadline::after(o.rdzv_connect_timeout);
      for (;;) {
        token = read_local_token(local_token_dir, local_token_port);
        if (!token.empty()) {
          client = std::make_unique<RendezvousClient>(endpoint, token, co);
          try {
            client->wait_connected(std::min<std::chrono::milliseconds>(
                std::chrono::seconds(2),
                std::chrono::ceil<std::chrono::milliseconds>(give_up.remaining())));
            return;
          } catch (const Error&) {  // not served yet, or a token left by an earlier job
          }
        }
        if (give_up.expired()) {
          throw Unavailable(fmt::format(
              "rendezvous endpoint {} unreachable within {}: no agent on this host serves it "
              "(looked for its token at {})",
              endpoint, format_duration(o.rdzv_connect_timeout),
              local_token_path(local_token_dir, local_token_port)));
        }
        pollfd p{signal_fd, 0, 0};
        ::poll(&p, 1, 100);
      }
    }
    client = std::make_unique<RendezvousClient>(endpoint, token, co);
    client->wait_connected(o.rdzv_connect_timeout);
  }

  AgentResult run() {
    const auto [program, program_args] = program_command(o);
    for (const std::string& note : o.notes)
      std::fprintf(stderr, "tessel-run: note: %s\n", note.c_str());
    if (o.standalone && !o.rdzv_id_given) o.rdzv_id = generate_run_id();
    char nonce[16];
    snprintf(nonce, sizeof(nonce), "%08x",
             static_cast<unsigned>(std::hash<std::string>{}(generate_token())));
    node_id = fmt::format("{}:{}:{}", host, getpid(), nonce);
    guard = std::make_unique<OrphanGuard>(node_id);  // before any thread
    default_log_dir = o.log_dir.empty();
    log_dir = make_log_dir(o);
    try {
      events = std::make_unique<EventLog>(o.event_log, host, o.rdzv_id);
    } catch (const IoError& e) {
      throw InvalidArgument(e.message());
    }

    start_rendezvous();
    // The worker-facing address: the one that reaches the rendezvous (or --local-addr).
    route = network_route_to(endpoint_host(endpoint));
    if (!o.local_addr.empty()) {
      route = {o.local_addr, interface_with_address(o.local_addr)};
      TESSEL_CHECK(!route.interface.empty(), InvalidArgument,
                   "--local-addr {} is not an address of this host", o.local_addr);
    }
    connect();

    LogMuxOptions mo;
    mo.prefix_format = o.log_prefix;
    mo.host = host;
    mo.role = o.role;
    mo.redirects = o.redirects;
    mo.console_local_ranks = o.local_ranks_filter;
    mux = std::make_unique<LogMux>(mo);
    event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (event_fd < 0) throw_system_error("eventfd", errno);
    workers = std::make_unique<WorkerGroup>(program, program_args, mux.get(), guard.get());
    exit_log = make_exit_log(endpoint, token, o.tls, o.rdzv_id, fr_files);
    workers->add_external_fd(signal_fd);
    workers->add_external_fd(event_fd);

    for (;;) {
      proto::JoinRequest join;
      join.set_node_id(node_id);
      join.set_host(host);
      join.set_nproc(o.nproc_per_node);
      join.set_requested_rank(o.node_rank);
      join.set_master_port(free_port());
      join.set_addr(route.address);
      Joined joined = join_round(join);
      if (joined.exit) return *joined.exit;
      if (joined.again) continue;
      if (joined.finished) return final_result(*joined.finished);
      const proto::JoinResponse& r = *joined.round;
      events->round_started(r, route.address);
      log_info(kL, "round {}: group rank {} of {}, ranks {}..{} of {}", r.round(), r.group_rank(),
               r.group_world_size(), r.rank_offset(), r.rank_offset() + o.nproc_per_node - 1,
               r.world_size());
      attempt_dir = fmt::format("{}/attempt_{}", log_dir, r.restart_count());
      make_dir(attempt_dir);
      std::vector<int> ranks;
      for (int i = 0; i < o.nproc_per_node; ++i) ranks.push_back(r.rank_offset() + i);
      mux->begin_attempt(attempt_dir, r.group_rank(), ranks);
      RoundControl control(*client, node_id, r.round(), o.monitor_interval, o.heartbeat_misses,
                           event_fd);
      workers->start(specs(r));
      proto::JobEvent event;
      server_refused = false;
      const RoundEnd end = supervise(r, control, &event);
      control.stop();
      last_round = r;
      last_heartbeat = control.last_heartbeat();
      if (end == RoundEnd::kLinkLost && server_refused && !server) {
        const std::string why =
            "the rendezvous server's agent there is gone (its host refused the connection)";
        if (auto exit = take_over(r, control.last_heartbeat(), why)) return *exit;
        continue;
      }
      if (end == RoundEnd::kLinkLost) {
        // Workers stopped; join the job again on a new connection: the old one may hold data
        // behind TCP retransmission timers that a blip of seconds has backed off to seconds,
        // which would hold the next round's answer and first heartbeats past the bound.
        RendezvousClientOptions co;
        co.tls = o.tls;
        co.private_connection = true;
        client = std::make_unique<RendezvousClient>(endpoint, token, co);
        continue;
      }
      if (event.kind() != proto::JobEvent::SUCCEEDED) {
        events->round_failed(event);
        after_exclusions(event.root_cause());
      }
      if (end == RoundEnd::kRestart) {
        last_root_cause = event.root_cause();
        continue;
      }
      return final_result(event);
    }
  }
};

NodeAgent::NodeAgent(LaunchOptions options, int signal_fd) : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(options);
  impl_->signal_fd = signal_fd;
}

NodeAgent::~NodeAgent() {
  if (impl_->workers) impl_->workers->kill_all();
  impl_->workers.reset();
  if (impl_->server) impl_->server->stop();
  if (impl_->published_token) {
    withdraw_local_token(impl_->local_token_dir, impl_->local_token_port, impl_->token);
  }
  if (impl_->event_fd >= 0) ::close(impl_->event_fd);
}

AgentResult NodeAgent::run() {
  AgentResult result = run_guarded();
  // A job that succeeded needs no rings (a failed one keeps them for `tessel-trace recover`).
  if (result.exit_status == 0) {
    remove_worker_rings(impl_->fr_files, impl_->ended_ranks, impl_->ended_pids);
  }
  // A default log directory goes once the job succeeded (failures keep theirs: the report
  // points into it); --log-dir and --keep-logs keep it.
  if (result.exit_status == 0 && impl_->default_log_dir && !impl_->o.keep_logs &&
      !impl_->log_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(impl_->log_dir, ignored);
    result.log_dir.clear();
  }
  return result;
}

AgentResult NodeAgent::run_guarded() {
  try {
    return impl_->run();
  } catch (const ProgramError& e) {
    return error_result(
        e.exit_status() == 127 ? ExitCode::kProgramNotFound : ExitCode::kProgramNotExecutable,
        e.message());
  } catch (const Unavailable& e) {
    return error_result(ExitCode::kRendezvousUnreachable, e.message());
  } catch (const RpcError& e) {
    if (e.code() == grpc::StatusCode::UNAUTHENTICATED) {
      return error_result(ExitCode::kUnauthenticated, e.message());
    }
    if (e.code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return error_result(ExitCode::kRendezvousTimeout,
                          fmt::format("{} (--rdzv-timeout {})", e.message(),
                                      format_duration(impl_->o.rdzv_timeout)));
    }
    if (e.code() == grpc::StatusCode::UNAVAILABLE) {
      return error_result(ExitCode::kRendezvousUnreachable, e.message());
    }
    return error_result(ExitCode::kInternal, e.message());
  } catch (const InvalidArgument& e) {
    const bool token = e.message().find("token") != std::string::npos;
    return error_result(token ? ExitCode::kUnauthenticated : ExitCode::kInvalidConfig, e.message());
  } catch (const IoError& e) {
    // A token file that cannot be read is a missing token, not an internal failure.
    const bool token = e.message().find("token") != std::string::npos;
    return error_result(token ? ExitCode::kUnauthenticated : ExitCode::kInternal, e.message());
  } catch (const std::exception& e) {
    return error_result(ExitCode::kInternal, e.what());
  }
}

AgentResult run_rendezvous_server(const LaunchOptions& o, int signal_fd) {
  try {
    const std::string token = load_token(o.rdzv_token_file);
    const char* tmp = std::getenv("TMPDIR");
    const std::string log_dir = o.log_dir.empty() ? std::string(tmp ? tmp : "/tmp") : o.log_dir;
    auto address = std::make_shared<std::string>();
    auto so = server_options(o, o.rdzv_endpoint, token);
    so.on_hang = hang_hook(o, address, token, log_dir);
    RendezvousServer server(so);
    *address = server.address();
    return serve_until_outcome(server, signal_fd, o.max_restarts, log_dir);
  } catch (const InvalidArgument& e) {
    return error_result(ExitCode::kUnauthenticated, e.message());
  } catch (const CommError& e) {
    return error_result(ExitCode::kInvalidConfig, e.message());
  } catch (const std::exception& e) {
    return error_result(ExitCode::kInternal, e.what());
  }
}

}  // namespace tessel::launcher
