#include "tessel/launcher/options.h"

#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstring>
#include <sstream>
#include <thread>

#include "tessel/base/clock.h"
#include "tessel/base/env.h"
#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"
#include "tessel/launcher/slurm_env.h"

extern char** environ;

namespace tessel::launcher {
namespace {

int parse_int(const std::string& what, const std::string& text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TESSEL_CHECK(ec == std::errc() && end == text.data() + text.size(), InvalidArgument,
               "{} '{}' is not an integer", what, text);
  return value;
}

std::chrono::milliseconds parse_ms(const std::string& what, const std::string& text) {
  try {
    return std::chrono::duration_cast<std::chrono::milliseconds>(parse_duration(text));
  } catch (const Error& e) {
    throw InvalidArgument(fmt::format("{}: {}", what, e.message()));
  }
}

int cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// "--nproc_per_node=4" -> "--nproc-per-node=4": torchrun accepts both spellings.
std::string normalize_flag(const std::string& arg) {
  const size_t eq = arg.find('=');
  std::string name = arg.substr(0, eq);
  std::replace(name.begin() + 2, name.end(), '_', '-');
  return eq == std::string::npos ? name : name + arg.substr(eq);
}

std::string flag_name(const std::string& normalized) {
  return normalized.substr(2, normalized.find('=') - 2);
}

std::string pet_name(const std::string& flag) {
  std::string name = "PET_" + flag;
  for (char& c : name) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

const std::string* find(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

std::pair<int, int> parse_nnodes(const std::string& text) {
  const size_t colon = text.find(':');
  int lo = 0, hi = 0;
  try {
    lo = parse_int("--nnodes", text.substr(0, colon));
    hi = colon == std::string::npos ? lo : parse_int("--nnodes", text.substr(colon + 1));
  } catch (const InvalidArgument&) {
    throw InvalidArgument(fmt::format("--nnodes '{}' is not N or MIN:MAX", text));
  }
  TESSEL_CHECK(lo >= 1 && lo <= hi, InvalidArgument,
               "--nnodes {} needs 1 <= MIN <= MAX (got MIN {} and MAX {})", text, lo, hi);
  return {lo, hi};
}

StreamSelection parse_stream_selection(const std::string& text) {
  auto value = [&](const std::string& v) {
    const int n = parse_int("--redirects/--tee", v);
    TESSEL_CHECK(n >= 0 && n <= 3, InvalidArgument,
                 "--redirects/--tee '{}': {} must be 0 (none), 1 (stdout), 2 (stderr) or 3 (both)",
                 text, n);
    return n;
  };
  StreamSelection s;
  if (text.find(':') == std::string::npos) {
    s.all = value(text);
    return s;
  }
  // torchrun's per-rank form: "LOCAL_RANK:VALUE,..."
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t colon = item.find(':');
    TESSEL_CHECK(colon != std::string::npos, InvalidArgument,
                 "--redirects/--tee '{}': item '{}' is not LOCAL_RANK:VALUE", text, item);
    const int rank = parse_int("--redirects/--tee local rank", item.substr(0, colon));
    TESSEL_CHECK(rank >= 0, InvalidArgument, "--redirects/--tee '{}': local rank {} is negative",
                 text, rank);
    s.per_rank[rank] = value(item.substr(colon + 1));
  }
  return s;
}

std::string default_log_root(const Environment& env) {
  const std::string* tmp = find(env, "TMPDIR");
  return fmt::format("{}/tessel-run-{}", tmp ? *tmp : "/tmp", getuid());
}

std::string normalize_endpoint(const std::string& endpoint) {
  TESSEL_CHECK(!endpoint.empty(), InvalidArgument, "--rdzv-endpoint is empty; expected HOST:PORT");
  std::string host, port;
  if (endpoint.front() == '[') {
    const size_t close = endpoint.find(']');
    TESSEL_CHECK(close != std::string::npos && close > 1, InvalidArgument,
                 "--rdzv-endpoint '{}' has no closing ']'; expected [IPv6]:PORT", endpoint);
    host = endpoint.substr(0, close + 1);
    const std::string rest = endpoint.substr(close + 1);
    TESSEL_CHECK(rest.empty() || rest.front() == ':', InvalidArgument,
                 "--rdzv-endpoint '{}': expected [IPv6]:PORT", endpoint);
    port = rest.empty() ? "" : rest.substr(1);
  } else {
    TESSEL_CHECK(std::count(endpoint.begin(), endpoint.end(), ':') <= 1, InvalidArgument,
                 "--rdzv-endpoint '{}': an IPv6 address needs brackets, as in [::1]:29400",
                 endpoint);
    const size_t colon = endpoint.find(':');
    host = endpoint.substr(0, colon);
    port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
  }
  TESSEL_CHECK(!host.empty(), InvalidArgument, "--rdzv-endpoint '{}' has no host", endpoint);
  if (port.empty()) port = "29400";  // torchrun's default rendezvous port
  const int n = parse_int("--rdzv-endpoint port", port);
  TESSEL_CHECK(n > 0 && n < 65536, InvalidArgument,
               "--rdzv-endpoint '{}': port {} must be in 1..65535", endpoint, n);
  return host + ":" + std::to_string(n);
}

namespace {

// Placeholders --log-prefix may use.
void check_log_prefix(const std::string& format) {
  static const std::set<std::string> known = {"{node}", "{rank}", "{local_rank}",
                                              "{host}", "{role}", "{stream}"};
  for (size_t open = format.find('{'); open != std::string::npos;
       open = format.find('{', open + 1)) {
    const size_t close = format.find('}', open);
    const std::string token =
        format.substr(open, close == std::string::npos ? std::string::npos : close - open + 1);
    TESSEL_CHECK(known.count(token) != 0, InvalidArgument,
                 "--log-prefix '{}': unknown placeholder '{}'; expected {{node}}, {{rank}}, "
                 "{{local_rank}}, {{host}}, {{role}} or {{stream}}",
                 format, token);
  }
}

// torchrun's --log-line-prefix-template macros in our --log-prefix spelling.
std::string from_torchrun_template(std::string t) {
  for (auto [from, to] : {std::pair{"${role_name}", "{role}"},
                          {"${local_rank}", "{local_rank}"},
                          {"${rank}", "{rank}"},
                          {"${hostname}", "{host}"}}) {
    for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at)) {
      t.replace(at, std::strlen(from), to);
    }
  }
  return t;
}

// "key=value,key=value" (torchrun's --rdzv-conf).
std::map<std::string, std::string> parse_rdzv_conf(const std::string& text) {
  std::map<std::string, std::string> conf;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    TESSEL_CHECK(eq != std::string::npos && eq > 0, InvalidArgument,
                 "--rdzv-conf '{}': item '{}' is not key=value", text, item);
    conf[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return conf;
}

std::chrono::milliseconds conf_seconds(const std::string& key, const std::string& value) {
  try {
    const double secs = std::stod(value);
    TESSEL_CHECK(secs > 0, InvalidArgument, "--rdzv-conf {}={} must be positive", key, value);
    return std::chrono::milliseconds(static_cast<int64_t>(secs * 1000));
  } catch (const std::logic_error&) {
    throw InvalidArgument(fmt::format("--rdzv-conf {}={} is not a number of seconds", key, value));
  }
}

// Under srun: nodes (unless --nnodes was given: an elastic MIN:MAX, say), node rank, run id
// and endpoint from the step (launcher/slurm_env.h), where flags and PET_* left them open.
void apply_slurm_step(const SlurmStep& step, const Environment& env, bool nnodes_given,
                      LaunchOptions& o, std::string& nnodes) {
  if (!nnodes_given) nnodes = std::to_string(step.nnodes);
  o.topology_source = "slurm";
  if (o.node_rank < 0) o.node_rank = step.node_rank;
  if (!step.job_id.empty() && !o.rdzv_id_given) {
    o.rdzv_id = step.job_id;
    o.rdzv_id_given = true;
  }
  // One node needs no endpoint: it runs standalone, as without Slurm.
  if (o.rdzv_endpoint.empty() && step.nnodes > 1) o.rdzv_endpoint = slurm_rdzv_endpoint(step, env);
}

}  // namespace

ParseResult parse_launch_options(int argc, const char* const* argv, const Environment& env) {
  LaunchOptions o;
  std::string nnodes = "1:1", nproc = "1", monitor = "100ms", rdzv_timeout = "900s",
              connect_timeout = "20s", last_call = "1s", failure_grace = "500ms",
              signal_grace = "10s", hang_dump_timeout = "30s", redirects = "0", tee = "0",
              ranks_filter, rdzv_conf, start_method = "spawn", logs_specs, event_log_handler,
              prefix_template, stdout_filters, stderr_filters, numa_binding, signals_to_handle,
              shutdown_timeout, master_port = "0", node_rank = "-1";
  bool no_usr_forward = false, virtual_local_rank = false;
  const auto knob = [&](EnvKnob k) {  // TESSEL_TLS_*: names from the knob table (base/env.cc)
    const std::string* value = find(env, std::string(env_knob_info(k).name));
    return value != nullptr ? *value : std::string();
  };
  o.tls = {knob(EnvKnob::kTlsCert), knob(EnvKnob::kTlsKey), knob(EnvKnob::kTlsCa)};

  CLI::App app{"tessel-run: start and supervise a distributed job (torchrun-compatible flags)",
               "tessel-run"};
  app.set_help_flag("-h,--help", "print this help and exit");
  app.get_formatter()->column_width(34);
  app.option_defaults()->always_capture_default();
  app.add_option("--nnodes", nnodes, "nodes in the job: N or MIN:MAX (elastic)");
  app.add_option("--nproc-per-node", nproc, "workers per node: N, auto, cpu or gpu");
  app.add_flag("--standalone", o.standalone,
               "single node: a private rendezvous on 127.0.0.1 and a fresh token");
  app.add_option("--rdzv-endpoint", o.rdzv_endpoint, "rendezvous server HOST[:PORT] (port 29400)");
  app.add_option("--rdzv-id", o.rdzv_id, "job id shared by every node (TORCHELASTIC_RUN_ID)");
  app.add_option("--rdzv-backend", o.rdzv_backend,
                 "accepted for torchrun compatibility (static, c10d, ...): one rendezvous here");
  app.add_option("--rdzv-conf", rdzv_conf,
                 "torchrun's key=value,...: join_timeout, last_call_timeout, is_host, ...");
  app.add_option("--rdzv-token-file", o.rdzv_token_file,
                 "file (mode 0600) holding the job token; or set TESSEL_RDZV_TOKEN");
  app.add_option("--rdzv-tls-cert", o.tls.cert, "PEM certificate: TLS for the rendezvous/store");
  app.add_option("--rdzv-tls-key", o.tls.key, "PEM private key of --rdzv-tls-cert");
  app.add_option("--rdzv-tls-ca", o.tls.ca,
                 "PEM CA: verify the server; on the server, require "
                 "client certificates (mutual TLS)");
  app.add_option("--rdzv-timeout", rdzv_timeout, "how long to wait for a round to form");
  app.add_option("--rdzv-connect-timeout", connect_timeout,
                 "give up on an unreachable endpoint after retrying this long");
  app.add_option("--last-call-timeout", last_call,
                 "with MIN:MAX, wait this long for more nodes once MIN have joined");
  app.add_flag("--rdzv-server", o.rdzv_server_only,
               "run only the rendezvous server at --rdzv-endpoint (no workers)");
  app.add_option("--node-rank", node_rank, "this node's group rank (-1: assigned)");
  app.add_option("--local-addr", o.local_addr,
                 "this node's address for workers (default: the one reaching the endpoint)");
  app.add_option("--master-addr", o.master_addr, "MASTER_ADDR for workers (default: node 0)");
  app.add_option("--master-port", master_port, "MASTER_PORT for workers (0: a free port)");
  app.add_option("--max-restarts", o.max_restarts, "job restarts allowed after failures");
  app.add_option("--monitor-interval", monitor, "heartbeat interval (node lost after x misses)");
  app.add_option("--heartbeat-misses", o.heartbeat_misses, "missed heartbeats that lose a node");
  app.add_option("--failure-grace", failure_grace,
                 "after a failure, SIGTERM to SIGKILL delay for the other workers");
  app.add_option("--signal-grace", signal_grace,
                 "after SIGINT/SIGTERM, delay before SIGKILL (a second SIGINT kills at once)");
  app.add_option("--shutdown-timeout", shutdown_timeout, "torchrun's name for --signal-grace (s)");
  app.add_flag("--no-forward-usr-signals", no_usr_forward,
               "do not forward SIGUSR1/SIGUSR2 to the workers");
  app.add_option("--signals-to-handle", signals_to_handle,
                 "accepted for torchrun compatibility (see docs/launching.md)");
  app.add_flag("--dump-on-hang", o.dump_on_hang,
               "on any worker failure, gather every rank's flight recorder first");
  app.add_option("--hang-dump-timeout", hang_dump_timeout,
                 "how long to wait for every rank's flight-recorder dump on a hang");
  app.add_option("--trace-tool", o.trace_tool, "program run as `TOOL analyze DIR` on dumps");
  bool exclude_on = false, exclude_off = false;  // neither: on with --nnodes MIN:MAX, MIN < MAX
  app.add_flag("--exclude-culprits", exclude_on,
               "take a failed round's culprit nodes out of the job for its life (default: on "
               "with --nnodes MIN:MAX)");
  app.add_flag("--no-exclude-culprits", exclude_off, "never take nodes out of the job");
  app.add_option("--on-exclude", o.on_exclude,
                 "command (sh -c) run when a node is taken out; TESSEL_EXCLUDED_HOST, _ADDR, "
                 "_REASON in its environment");
  app.add_flag("--drain-excluded", o.drain_excluded,
               "under Slurm (SLURM_JOB_ID set): scontrol update nodename=HOST state=drain for a "
               "node taken out");
  app.add_option("--event-log", o.event_log, "append one JSON object per job event to this file");
  app.add_option("--log-dir", o.log_dir,
                 "log directory (one attempt_N folder per attempt); default: a new one under "
                 "$TMPDIR/tessel-run-UID, removed after success unless --keep-logs");
  app.add_flag("--keep-logs", o.keep_logs, "keep the default log directory after success");
  app.add_option("--log-prefix", o.log_prefix,
                 "line prefix; {node} {rank} {local_rank} {host} {role} {stream} are replaced");
  app.add_option("--log-line-prefix-template", prefix_template,
                 "torchrun's prefix template (${rank} ${local_rank} ${hostname} ${role_name})");
  app.add_option("-r,--redirects", redirects,
                 "streams kept off the console: 0-3, or per local rank as 0:1,1:2");
  app.add_option("-t,--tee", tee,
                 "streams teed to files and console: 0-3 or 0:1,1:2 (always teed)");
  app.add_option("--local-ranks-filter", ranks_filter,
                 "comma-separated local ranks whose output reaches the console");
  app.add_option("--duplicate-stdout-filters", stdout_filters, "accepted; see docs/launching.md");
  app.add_option("--duplicate-stderr-filters", stderr_filters, "accepted; see docs/launching.md");
  app.add_option("--role", o.role, "workers' role (ROLE_NAME)");
  app.add_flag("-m,--module", o.module, "PROGRAM is a Python module: python -m PROGRAM");
  app.add_flag("--no-python", o.no_python, "execute PROGRAM itself, even a .py file");
  app.add_flag("--run-path", o.run_path, "run PROGRAM with Python's runpy.run_path");
  app.add_option("--start-method", start_method,
                 "accepted (spawn, fork, forkserver): workers "
                 "are always fork+exec'd processes");
  app.add_option("--logs-specs", logs_specs, "accepted; Python log specs do not apply here");
  app.add_option("--event-log-handler", event_log_handler,
                 "accepted; tessel-run writes its own JSON events with --event-log");
  app.add_option("--numa-binding", numa_binding, "accepted; no NUMA binding here");
  app.add_flag("--virtual-local-rank", virtual_local_rank, "accepted; LOCAL_RANK is real here");

  // Split argv: flags (normalised), then PROGRAM and everything after it untouched.
  std::vector<std::string> flags;
  std::set<std::string> given;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    if (arg.rfind("--", 0) == 0) arg = normalize_flag(arg);
    const std::string name = arg.rfind("--", 0) == 0 ? flag_name(arg) : arg.substr(1, 1);
    const CLI::Option* opt =
        app.get_option_no_throw(arg.rfind("--", 0) == 0 ? "--" + name : "-" + name);
    if (opt == nullptr) {
      return {std::nullopt, exit_status(ExitCode::kUsage),
              fmt::format("tessel-run: unknown flag '{}' (see tessel-run --help)", argv[i])};
    }
    given.insert(opt->get_lnames().empty() ? name : opt->get_lnames().front());
    flags.push_back(arg);
    if (opt->get_items_expected_max() > 0 && arg.find('=') == std::string::npos && i + 1 < argc) {
      flags.push_back(argv[++i]);
    }
  }
  if (i < argc) {
    o.program = argv[i];
    for (int j = i + 1; j < argc; ++j) o.program_args.emplace_back(argv[j]);
  }
  // torchrun's PET_<FLAG> variables stand in for flags that were not given.
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string& lname = opt->get_lnames().front();
    if (lname == "help" || given.count(lname) != 0) continue;
    if (const std::string* v = find(env, pet_name(lname))) {
      flags.push_back("--" + lname + "=" + *v);
      given.insert(lname);
    }
  }

  std::vector<const char*> cargv{"tessel-run"};
  for (const auto& f : flags) cargv.push_back(f.c_str());
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0,
            app.help() +
                "\nUsage: tessel-run [flags] PROGRAM [ARGS...]\n"
                "Underscore spellings (--nproc_per_node) and PET_<FLAG> environment "
                "defaults are accepted. See docs/launching.md.\n"};
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, exit_status(ExitCode::kUsage), fmt::format("tessel-run: {}", e.what())};
  }

  try {
    o.rdzv_id_given = given.count("rdzv-id") != 0;
    o.node_rank = parse_int("--node-rank", node_rank);
    o.master_port = parse_int("--master-port", master_port);
    // Values mpirun or Slurm provide, where flags and PET_* left them open.
    const bool nnodes_given = given.count("nnodes") != 0;
    if (nnodes_given && !o.standalone && find(env, launch_env::kOmpiSize) == nullptr &&
        parse_nnodes(nnodes).second > 1) {
      if (const auto step = read_slurm_step(env)) apply_slurm_step(*step, env, true, o, nnodes);
    }
    if (!nnodes_given) {
      if (const std::string* n = find(env, launch_env::kOmpiSize)) {
        nnodes = *n;
        o.topology_source = "mpirun";
        if (o.node_rank < 0)
          o.node_rank = parse_int(launch_env::kOmpiRank, *find(env, launch_env::kOmpiRank));
      } else if (const auto step = read_slurm_step(env)) {
        apply_slurm_step(*step, env, false, o, nnodes);
      } else if (in_slurm_batch_script(env)) {
        o.notes.push_back(fmt::format(
            "{}={} but this is the batch script, not an srun step: running on this node only "
            "(start one tessel-run per node with srun --ntasks-per-node 1)",
            launch_env::kSlurmNnodes, *find(env, launch_env::kSlurmNnodes)));
      }
      if (o.topology_source == "mpirun" && o.rdzv_endpoint.empty()) {
        const std::string* addr = find(env, launch_env::kMasterAddr);
        const std::string* port = find(env, launch_env::kMasterPort);
        if (addr && port) o.rdzv_endpoint = *addr + ":" + *port;
      }
    }
    std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(nnodes);
    if (nproc == "auto" || nproc == "cpu" || nproc == "gpu") {
      const auto from_slurm =
          o.topology_source == "slurm" ? slurm_nproc_per_node(nproc, env) : std::nullopt;
      o.nproc_per_node = from_slurm.value_or(cpu_count());
    } else {
      o.nproc_per_node = parse_int("--nproc-per-node", nproc);
    }
    TESSEL_CHECK(o.nproc_per_node >= 1, InvalidArgument, "--nproc-per-node {} must be at least 1",
                 o.nproc_per_node);
    const auto positive = [](const char* flag, const std::string& text) {
      const auto d = parse_ms(flag, text);
      TESSEL_CHECK(d.count() > 0, InvalidArgument, "{} {} must be positive (e.g. 30s)", flag, text);
      return d;
    };
    const auto non_negative = [](const char* flag, const std::string& text) {
      const auto d = parse_ms(flag, text);
      TESSEL_CHECK(d.count() >= 0, InvalidArgument, "{} {} must not be negative", flag, text);
      return d;
    };
    o.monitor_interval = positive("--monitor-interval", monitor);
    o.rdzv_timeout = positive("--rdzv-timeout", rdzv_timeout);
    o.rdzv_connect_timeout = positive("--rdzv-connect-timeout", connect_timeout);
    o.last_call_timeout = non_negative("--last-call-timeout", last_call);
    o.failure_grace = non_negative("--failure-grace", failure_grace);
    o.signal_grace = non_negative("--signal-grace", signal_grace);
    if (!shutdown_timeout.empty()) {
      const int secs = parse_int("--shutdown-timeout", shutdown_timeout);
      TESSEL_CHECK(secs >= 0, InvalidArgument, "--shutdown-timeout {} must not be negative", secs);
      o.signal_grace = std::chrono::seconds(secs);
    }
    o.hang_dump_timeout = positive("--hang-dump-timeout", hang_dump_timeout);
    TESSEL_CHECK(!(exclude_on && exclude_off), InvalidArgument,
                 "--exclude-culprits and --no-exclude-culprits contradict each other");
    o.exclude_culprits = exclude_on || (!exclude_off && o.min_nodes < o.max_nodes);
    o.forward_usr_signals = !no_usr_forward;
    o.redirects = parse_stream_selection(redirects);
    o.tee = parse_stream_selection(tee);
    TESSEL_CHECK(o.max_restarts >= 0, InvalidArgument, "--max-restarts {} must be >= 0",
                 o.max_restarts);
    TESSEL_CHECK(o.heartbeat_misses >= 1, InvalidArgument, "--heartbeat-misses {} must be >= 1",
                 o.heartbeat_misses);
    TESSEL_CHECK(o.master_port >= 0 && o.master_port < 65536, InvalidArgument,
                 "--master-port {} must be in 1..65535 (or 0: a free port)", o.master_port);
    if (!prefix_template.empty()) o.log_prefix = from_torchrun_template(prefix_template);
    check_log_prefix(o.log_prefix);
    TESSEL_CHECK(!o.role.empty(), InvalidArgument, "--role must not be empty");
    if (!ranks_filter.empty()) {
      std::set<int> ranks;
      size_t start = 0;
      while (start <= ranks_filter.size()) {
        const size_t comma = std::min(ranks_filter.find(',', start), ranks_filter.size());
        const int r = parse_int("--local-ranks-filter", ranks_filter.substr(start, comma - start));
        TESSEL_CHECK(r >= 0, InvalidArgument, "--local-ranks-filter {}: rank {} is negative",
                     ranks_filter, r);
        ranks.insert(r);
        start = comma + 1;
      }
      o.local_ranks_filter = ranks;
    }
    TESSEL_CHECK(start_method == "spawn" || start_method == "fork" || start_method == "forkserver",
                 InvalidArgument, "--start-method '{}': expected spawn, fork or forkserver",
                 start_method);
    if (given.count("start-method")) {
      o.notes.push_back(
          fmt::format("--start-method {}: workers are always started with "
                      "fork+exec here",
                      start_method));
    }
    for (auto [flag, value] : {std::pair{"--logs-specs", &logs_specs},
                               {"--event-log-handler", &event_log_handler},
                               {"--numa-binding", &numa_binding},
                               {"--duplicate-stdout-filters", &stdout_filters},
                               {"--duplicate-stderr-filters", &stderr_filters},
                               {"--signals-to-handle", &signals_to_handle}}) {
      if (!value->empty()) {
        o.notes.push_back(
            fmt::format("{} {}: has no effect under tessel-run (see "
                        "docs/launching.md)",
                        flag, *value));
      }
    }
    if (virtual_local_rank) {
      o.notes.push_back("--virtual-local-rank: has no effect; LOCAL_RANK is each worker's own");
    }
    if (o.rdzv_backend != "static" && o.rdzv_backend != "c10d") {
      o.notes.push_back(
          fmt::format("--rdzv-backend {}: tessel-run always uses its own "
                      "rendezvous server (like c10d)",
                      o.rdzv_backend));
    }
    o.rdzv_conf = parse_rdzv_conf(rdzv_conf);
    for (const auto& [key, value] : o.rdzv_conf) {
      if (key == "join_timeout" || key == "timeout") {
        o.rdzv_timeout = conf_seconds(key, value);
      } else if (key == "last_call_timeout") {
        o.last_call_timeout = conf_seconds(key, value);
      } else if (key == "read_timeout") {
        o.rdzv_connect_timeout = conf_seconds(key, value);
      } else if (key == "keep_alive_interval") {
        o.monitor_interval = conf_seconds(key, value);
      } else if (key == "keep_alive_max_attempt") {
        o.heartbeat_misses = parse_int("--rdzv-conf keep_alive_max_attempt", value);
        TESSEL_CHECK(o.heartbeat_misses >= 1, InvalidArgument,
                     "--rdzv-conf keep_alive_max_attempt={} must be >= 1", value);
      } else if (key == "is_host") {
        const auto b = parse_bool(value);
        TESSEL_CHECK(b.has_value(), InvalidArgument,
                     "--rdzv-conf is_host={} is not a boolean (true/false, 1/0)", value);
        o.is_host = *b;
      } else {
        o.notes.push_back(
            fmt::format("--rdzv-conf {}={}: has no effect under tessel-run", key, value));
      }
    }
    if (o.standalone) {
      TESSEL_CHECK(o.max_nodes == 1, InvalidArgument,
                   "--standalone runs one node but --nnodes is {}", nnodes);
      TESSEL_CHECK(o.rdzv_endpoint.empty(), InvalidArgument,
                   "--standalone picks its own endpoint; drop --rdzv-endpoint {}", o.rdzv_endpoint);
    } else if (o.rdzv_endpoint.empty()) {
      // A single node without an endpoint is a standalone job, as in torchrun.
      TESSEL_CHECK(o.max_nodes == 1 && !o.rdzv_server_only, InvalidArgument,
                   "--nnodes {} needs --rdzv-endpoint HOST:PORT (or --standalone for one node)",
                   nnodes);
      o.standalone = true;
    } else {
      o.rdzv_endpoint = normalize_endpoint(o.rdzv_endpoint);
    }
    TESSEL_CHECK(o.node_rank >= -1 && o.node_rank < o.max_nodes, InvalidArgument,
                 "--node-rank {} must be in 0..{} (or -1: assigned by the rendezvous)", o.node_rank,
                 o.max_nodes - 1);
    TESSEL_CHECK(!o.tls.server_enabled() || !o.tls.key.empty(), InvalidArgument,
                 "--rdzv-tls-cert {} needs --rdzv-tls-key (or TESSEL_TLS_KEY)", o.tls.cert);
    if (!o.rdzv_server_only && o.program.empty()) {
      return {std::nullopt, exit_status(ExitCode::kUsage),
              "tessel-run: missing PROGRAM (usage: tessel-run [flags] PROGRAM [ARGS...])"};
    }
    TESSEL_CHECK(!(o.module && o.no_python), InvalidArgument,
                 "-m/--module runs PROGRAM with Python; it cannot go with --no-python");
  } catch (const Error& e) {
    return {std::nullopt, exit_status(ExitCode::kInvalidConfig),
            fmt::format("tessel-run: {}", e.message())};
  }
  return {std::move(o), 0, ""};
}

}  // namespace tessel::launcher
