#include "tessel/launcher/options.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"

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

ParseResult parse_launch_options(int argc, const char* const* argv, const Environment& env) {
  LaunchOptions o;
  std::string nnodes = "1:1", nproc = "1", monitor = "100ms", rdzv_timeout = "900s",
              connect_timeout = "20s", last_call = "1s", failure_grace = "500ms",
              signal_grace = "10s", hang_dump_timeout = "30s", redirects = "0", tee = "0", ranks_filter;
  bool no_usr_forward = false;

  CLI::App app{"tessel-run: start and supervise a distributed job (torchrun-compatible flags)",
               "tessel-run"};
  app.set_help_flag("-h,--help", "print this help and exit");
  app.get_formatter()->column_width(34);
  app.option_defaults()->always_capture_default();
  app.add_option("--nnodes", nnodes, "nodes in the job: N or MIN:MAX (elastic)");
  app.add_option("--nproc-per-node", nproc, "workers per node: N, auto, cpu or gpu");
  app.add_flag("--standalone", o.standalone,
               "single node: a private rendezvous on 127.0.0.1 and a fresh token");
  app.add_option("--rdzv-endpoint", o.rdzv_endpoint, "rendezvous server HOST:PORT");
  app.add_option("--rdzv-id", o.rdzv_id, "job id shared by every node (TORCHELASTIC_RUN_ID)");
  app.add_option("--rdzv-token-file", o.rdzv_token_file,
                 "file (mode 0600) holding the job token; or set TESSEL_RDZV_TOKEN");
  app.add_option("--rdzv-timeout", rdzv_timeout, "how long to wait for a round to form");
  app.add_option("--rdzv-connect-timeout", connect_timeout,
                 "give up on an unreachable endpoint after retrying this long");
  app.add_option("--last-call-timeout", last_call,
                 "with MIN:MAX, wait this long for more nodes once MIN have joined");
  app.add_flag("--rdzv-server", o.rdzv_server_only,
               "run only the rendezvous server at --rdzv-endpoint (no workers)");
  app.add_option("--node-rank", o.node_rank, "this node's group rank (-1: assigned)");
  app.add_option("--master-addr", o.master_addr, "MASTER_ADDR for workers (default: node 0)");
  app.add_option("--master-port", o.master_port, "MASTER_PORT for workers (0: a free port)");
  app.add_option("--max-restarts", o.max_restarts, "job restarts allowed after failures");
  app.add_option("--monitor-interval", monitor, "heartbeat interval (node lost after x misses)");
  app.add_option("--heartbeat-misses", o.heartbeat_misses, "missed heartbeats that lose a node");
  app.add_option("--failure-grace", failure_grace,
                 "after a failure, SIGTERM to SIGKILL delay for the other workers");
  app.add_option("--signal-grace", signal_grace,
                 "after SIGINT/SIGTERM, delay before SIGKILL (a second SIGINT kills at once)");
  app.add_flag("--no-forward-usr-signals", no_usr_forward,
               "do not forward SIGUSR1/SIGUSR2 to the workers");
  app.add_flag("--dump-on-hang", o.dump_on_hang,
               "on any worker failure, gather every rank's flight recorder first");
  app.add_option("--hang-dump-timeout", hang_dump_timeout,
                 "how long to wait for every rank's flight-recorder dump on a hang");
  app.add_option("--trace-tool", o.trace_tool, "program run as `TOOL analyze DIR` on dumps");
  app.add_option("--log-dir", o.log_dir, "log directory (one attempt_N folder per attempt)");
  app.add_option("--log-prefix", o.log_prefix,
                 "line prefix; {node} {rank} {local_rank} {host} {stream} are replaced");
  app.add_option("-r,--redirects", redirects,
                 "streams kept off the console: 0-3, or per local rank as 0:1,1:2");
  app.add_option("-t,--tee", tee,
                 "streams teed to files and console: 0-3 or 0:1,1:2 (always teed)");
  app.add_option("--local-ranks-filter", ranks_filter,
                 "comma-separated local ranks whose output reaches the console");

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
    if (const std::string* v = find(env, pet_name(lname))) flags.push_back("--" + lname + "=" + *v);
  }

  std::vector<const char*> cargv{"tessel-run"};
  for (const auto& f : flags) cargv.push_back(f.c_str());
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0,
            app.help() + "\nUsage: tessel-run [flags] PROGRAM [ARGS...]\n"
                         "Underscore spellings (--nproc_per_node) and PET_<FLAG> environment "
                         "defaults are accepted. See docs/launching.md.\n"};
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, exit_status(ExitCode::kUsage), fmt::format("tessel-run: {}", e.what())};
  }

  try {
    // Values mpirun or Slurm provide, where flags and PET_* left them open.
    if (given.count("nnodes") == 0 && find(env, "PET_NNODES") == nullptr) {
      if (const std::string* n = find(env, "OMPI_COMM_WORLD_SIZE")) {
        nnodes = *n;
        o.topology_source = "mpirun";
        if (o.node_rank < 0) o.node_rank = parse_int("OMPI_COMM_WORLD_RANK",
                                                     *find(env, "OMPI_COMM_WORLD_RANK"));
      } else if (const std::string* n = find(env, "SLURM_NNODES")) {
        nnodes = *n;
        o.topology_source = "slurm";
        if (const std::string* r = find(env, "SLURM_NODEID"); r && o.node_rank < 0) {
          o.node_rank = parse_int("SLURM_NODEID", *r);
        }
        if (const std::string* id = find(env, "SLURM_JOB_ID"); id && o.rdzv_id == "none") {
          o.rdzv_id = *id;
        }
      }
      if (o.topology_source != "flags" && o.rdzv_endpoint.empty()) {
        const std::string* addr = find(env, "MASTER_ADDR");
        const std::string* port = find(env, "MASTER_PORT");
        if (addr && port) o.rdzv_endpoint = *addr + ":" + *port;
      }
    }
    std::tie(o.min_nodes, o.max_nodes) = parse_nnodes(nnodes);
    if (nproc == "auto" || nproc == "cpu" || nproc == "gpu") {
      o.nproc_per_node = cpu_count();
    } else {
      o.nproc_per_node = parse_int("--nproc-per-node", nproc);
    }
    TESSEL_CHECK(o.nproc_per_node >= 1, InvalidArgument,
                 "--nproc-per-node {} must be at least 1", o.nproc_per_node);
    o.monitor_interval = parse_ms("--monitor-interval", monitor);
    TESSEL_CHECK(o.monitor_interval.count() > 0, InvalidArgument,
                 "--monitor-interval {} must be positive", monitor);
    o.rdzv_timeout = parse_ms("--rdzv-timeout", rdzv_timeout);
    o.rdzv_connect_timeout = parse_ms("--rdzv-connect-timeout", connect_timeout);
    o.last_call_timeout = parse_ms("--last-call-timeout", last_call);
    o.failure_grace = parse_ms("--failure-grace", failure_grace);
    o.signal_grace = parse_ms("--signal-grace", signal_grace);
    o.hang_dump_timeout = parse_ms("--hang-dump-timeout", hang_dump_timeout);
    o.forward_usr_signals = !no_usr_forward;
    o.redirects = parse_stream_selection(redirects);
    o.tee = parse_stream_selection(tee);
    TESSEL_CHECK(o.max_restarts >= 0, InvalidArgument, "--max-restarts {} must be >= 0",
                 o.max_restarts);
    TESSEL_CHECK(o.heartbeat_misses >= 1, InvalidArgument, "--heartbeat-misses {} must be >= 1",
                 o.heartbeat_misses);
    if (!ranks_filter.empty()) {
      std::set<int> ranks;
      size_t start = 0;
      while (start <= ranks_filter.size()) {
        const size_t comma = std::min(ranks_filter.find(',', start), ranks_filter.size());
        ranks.insert(parse_int("--local-ranks-filter", ranks_filter.substr(start, comma - start)));
        start = comma + 1;
      }
      o.local_ranks_filter = ranks;
    }
    if (o.standalone) {
      TESSEL_CHECK(o.max_nodes == 1, InvalidArgument,
                   "--standalone runs one node but --nnodes is {}", nnodes);
      TESSEL_CHECK(o.rdzv_endpoint.empty(), InvalidArgument,
                   "--standalone picks its own endpoint; drop --rdzv-endpoint {}",
                   o.rdzv_endpoint);
    } else if (o.rdzv_endpoint.empty()) {
      // A single node without an endpoint is a standalone job, as in torchrun.
      TESSEL_CHECK(o.max_nodes == 1 && !o.rdzv_server_only, InvalidArgument,
                   "--nnodes {} needs --rdzv-endpoint HOST:PORT (or --standalone for one node)",
                   nnodes);
      o.standalone = true;
    } else {
      const size_t colon = o.rdzv_endpoint.rfind(':');
      TESSEL_CHECK(colon != std::string::npos && colon > 0, InvalidArgument,
                   "--rdzv-endpoint '{}' is not HOST:PORT", o.rdzv_endpoint);
      const int port = parse_int("--rdzv-endpoint port", o.rdzv_endpoint.substr(colon + 1));
      TESSEL_CHECK(port > 0 && port < 65536, InvalidArgument,
                   "--rdzv-endpoint port {} must be in 1..65535", port);
    }
    TESSEL_CHECK(o.node_rank < o.max_nodes, InvalidArgument,
                 "--node-rank {} must be below the node count {}", o.node_rank, o.max_nodes);
    if (!o.rdzv_server_only && o.program.empty()) {
      return {std::nullopt, exit_status(ExitCode::kUsage),
              "tessel-run: missing PROGRAM (usage: tessel-run [flags] PROGRAM [ARGS...])"};
    }
  } catch (const Error& e) {
    return {std::nullopt, exit_status(ExitCode::kInvalidConfig),
            fmt::format("tessel-run: {}", e.message())};
  }
  return {std::move(o), 0, ""};
}

}  // namespace tessel::launcher
