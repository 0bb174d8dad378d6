#include "tessel/launcher/hang_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/dumper.h"
#include "tessel/launcher/exec_path.h"
#include "tessel/store/store.h"

namespace tessel::launcher {

// How long fetch_dump waits for the newest answer before looking at older ones again.
constexpr Nanoseconds kFetchSlice = std::chrono::milliseconds(200);
// How long the gatherer waits on one rank before looking at every pending rank again.
constexpr Nanoseconds kPollSlice = std::chrono::milliseconds(50);
// Ranks that have not answered a dump request after this are named in the log.
constexpr Nanoseconds kAnnounceAfter = std::chrono::seconds(2);

StoreDumpChannel::StoreDumpChannel(std::shared_ptr<Store> store) : store_(std::move(store)) {}

void StoreDumpChannel::request_dumps(int64_t round, const std::string& reason) {
  const int64_t n = store_->add(std::string(fr::kStoreDumpCounterKey), 1);
  store_->set(
      fr::store_dump_request_key(n),
      fr::encode_store_dump_request(-1, fmt::format("launcher, round {}: {}", round, reason)));
  request_ = n;
}

std::optional<std::string> StoreDumpChannel::fetch_dump(int rank, Nanoseconds timeout) {
  // The rank's newest answer: to this request, or to an earlier one — a rank whose collective
  // timed out posted its own request, answered it and may have exited since.
  const int64_t latest = request_.load();
  const Deadline deadline = Deadline::after(timeout);
  for (;;) {
    for (int64_t n = latest; n >= 1; --n) {
      const std::string key = fr::store_dump_key(n, rank);
      if (store_->check({key})) return store_->get(key, kFetchSlice);
    }
    if (deadline.expired()) return std::nullopt;
    try {
      store_->wait({fr::store_dump_key(latest, rank)}, std::min(deadline.remaining(), kFetchSlice));
    } catch (const Timeout&) {
    }
  }
}

std::optional<WorkerExitRecord> StoreDumpChannel::exit_of(int64_t round, int rank) {
  const std::string key = store_exit_key(round, rank);
  if (!store_->check({key})) return std::nullopt;
  const std::string value = store_->get(key, kFetchSlice);
  WorkerExitRecord e;
  e.exit.rank = rank;
  long long code = 0, sig = 0, us = 0;
  int pid = 0, local = -1, used = 0;
  if (std::sscanf(value.c_str(), "%lld %lld %lld %d %d %n", &code, &sig, &us, &pid, &local, &used) <
      5) {
    return std::nullopt;
  }
  e.exit.exit_code = static_cast<int>(code);
  e.exit.signal = static_cast<int>(sig);
  e.exit.wall_time_us = us;
  e.pid = pid;
  e.local_rank = local;
  e.host = value.substr(static_cast<size_t>(used));
  return e;
}

std::optional<std::string> StoreDumpChannel::final_dump(int rank) {
  const std::string key = fr::store_final_dump_key(rank);
  if (!store_->check({key})) return std::nullopt;
  return store_->get(key, kFetchSlice);
}

std::optional<int> StoreDumpChannel::pid_of(int rank) {
  const std::string key = fr::store_ready_key(rank);
  if (!store_->check({key})) return std::nullopt;
  const std::string value = store_->get(key, kFetchSlice);
  char* end = nullptr;
  const long pid = std::strtol(value.c_str(), &end, 10);
  if (end == value.c_str() || pid <= 0) return std::nullopt;
  return static_cast<int>(pid);
}

std::optional<CollectiveFailure> StoreDumpChannel::failure_of(int rank) {
  const std::string key = fr::store_failure_key(rank);
  if (!store_->check({key})) return std::nullopt;
  try {
    auto [us, reason] = fr::decode_store_failure(store_->get(key, kFetchSlice));
    return CollectiveFailure{rank, us, std::move(reason)};
  } catch (const InvalidArgument& e) {
    log_warn(LogComponent::kLauncher, "rank {}: {}", rank, e.message());
    return std::nullopt;
  }
}

void StoreDumpChannel::clear_failures(int world_size) {
  for (int r = 0; r < world_size; ++r) {
    store_->delete_key(fr::store_failure_key(r));
    store_->delete_key(fr::store_final_dump_key(r));
  }
}

std::string store_exit_key(int64_t round, int rank) {
  return fmt::format("tessel/run/exit/{}/{}", round, rank);
}

WorkerExitLog::WorkerExitLog(std::shared_ptr<Store> store, JobRecorderFiles files)
    : store_(std::move(store)), files_(std::move(files)) {}

void WorkerExitLog::record(int64_t round, int rank, int local_rank, int pid, int exit_code,
                           int signal) {
  try {
    // A worker that died may have left a dump (its fatal-signal handler): post it for the
    // gatherer, which cannot ask a dead rank. Only this worker's: the file names its pid. One
    // that left none (SIGKILL) is recovered from its ring; a dump it wrote wins over its ring.
    if (exit_code != 0 || signal != 0) {
      std::ifstream in(fmt::format("{}/{}", files_.dump_dir, fr::dump_file_name(rank, 0)),
                       std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      std::optional<std::string> dump = text.str();
      if (dump->find(fmt::format("\"pid\":{},", pid)) == std::string::npos) {
        dump = recover_worker_ring(
            files_, rank, pid,
            signal != 0 ? fmt::format("signal {} (no dump; recovered from its ring)", signal)
                        : fmt::format("exit status {} without a dump (recovered from its ring)",
                                      exit_code));
      }
      // Never leave an earlier worker's dump of this rank for the gatherer to take.
      if (dump) {
        store_->set(fr::store_final_dump_key(rank), *dump);
      } else {
        store_->delete_key(fr::store_final_dump_key(rank));
      }
    }
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    store_->set(store_exit_key(round, rank),
                fmt::format("{} {} {} {} {} {}", signal != 0 ? -1 : exit_code, signal,
                            wall_time_us(), pid, local_rank, host));
  } catch (const Error& e) {
    log_warn(LogComponent::kLauncher, "could not record the exit of rank {}: {}", rank,
             e.message());
  }
}

bool WorkerExitLog::dump_responders(int world_size) {
  try {
    for (int r = 0; r < world_size; ++r) {
      if (store_->check({fr::store_ready_key(r)})) return true;
    }
  } catch (const Error& e) {
    log_warn(LogComponent::kLauncher, "cannot ask the store for dump responders: {}", e.message());
  }
  return false;
}

std::pair<int, std::string> run_capture(const std::vector<std::string>& argv, Nanoseconds timeout) {
  TESSEL_CHECK(!argv.empty(), InvalidArgument, "run_capture needs a program");
  const std::string program = find_program(argv[0]);
  std::vector<char*> cargv;
  cargv.push_back(const_cast<char*>(program.c_str()));
  for (size_t i = 1; i < argv.size(); ++i) cargv.push_back(const_cast<char*>(argv[i].c_str()));
  cargv.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw_system_error("pipe2", errno);
  const pid_t pid = fork();
  if (pid < 0) throw_system_error("fork of " + argv[0], errno);
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    dup2(out[1], 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  ::close(out[1]);
  std::string output;
  const Deadline deadline = Deadline::after(timeout);
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      kill(pid, SIGKILL);
      output += fmt::format("\n[killed after {}]", format_duration(timeout));
      break;
    }
    char buf[4096];
    const ssize_t got = ::read(out[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    output.append(buf, static_cast<size_t>(got));
  }
  ::close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  return {code, output};
}

HangReport gather_flight_recorder_dumps(DumpChannel& channel, int world_size, int64_t round,
                                        const std::string& reason, const std::string& dump_dir,
                                        Nanoseconds timeout, const std::string& trace_tool) {
  HangReport report;
  report.dump_dir = dump_dir;
  if (mkdir(dump_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw_system_error("mkdir " + dump_dir, errno);
  }
  channel.request_dumps(round, reason);
  const Deadline deadline = Deadline::after(timeout);
  auto write = [&](int rank, const std::string& dump) {
    const std::string path = fmt::format("{}/{}", dump_dir, fr::dump_file_name(rank, 0));
    std::ofstream out(path, std::ios::trunc);
    out << dump;
    TESSEL_CHECK(out.good(), IoError, "cannot write flight-recorder dump {}", path);
    report.gathered.push_back(rank);
  };
  // Round-robin over the ranks still to answer: a live rank's dump, or, once its agent says it
  // ended, whatever it left (never waiting for a dead rank).
  std::vector<int> pending(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) pending[static_cast<size_t>(r)] = r;
  const auto started = SteadyClock::now();
  bool announced = false;
  while (!pending.empty()) {
    if (!announced && SteadyClock::now() - started >= kAnnounceAfter) {
      // A stopped or busy rank: say whom the job waits for, and for how long at most.
      announced = true;
      std::vector<std::string> names;
      for (int r : pending) names.push_back(std::to_string(r));
      log_warn(LogComponent::kLauncher,
               "waiting up to {} more for the flight-recorder dump of {} {} (not answered after "
               "{}: stopped, or busy outside tessel's calls?)",
               format_duration(deadline.remaining()), pending.size() == 1 ? "rank" : "ranks",
               fmt::join(names, ","), format_duration(kAnnounceAfter));
    }
    std::vector<int> still;
    for (int rank : pending) {
      if (auto dump = channel.fetch_dump(rank, Nanoseconds::zero())) {
        write(rank, *dump);
      } else if (channel.exit_of(round, rank)) {
        if (auto last = channel.final_dump(rank)) write(rank, *last);
      } else {
        still.push_back(rank);
      }
    }
    pending = std::move(still);
    if (pending.empty() || deadline.expired()) break;
    // Wait on the first pending rank's answer for a slice, then look at all of them again.
    (void)channel.fetch_dump(pending.front(), std::min(deadline.remaining(), kPollSlice));
  }
  report.missing = pending;
  for (int rank : pending) {
    if (auto pid = channel.pid_of(rank)) report.missing_pids[rank] = *pid;
  }
  std::sort(report.gathered.begin(), report.gathered.end());
  std::vector<fr::ExitRecord> exits;
  for (int r = 0; r < world_size; ++r) {
    if (auto e = channel.exit_of(round, r)) {
      exits.push_back(e->exit);
      report.exits.push_back(std::move(*e));
    }
    if (auto f = channel.failure_of(r)) report.failures.push_back(std::move(*f));
  }
  channel.clear_failures(world_size);
  std::sort(report.failures.begin(), report.failures.end(),
            [](const CollectiveFailure& a, const CollectiveFailure& b) {
              return a.wall_time_us < b.wall_time_us;
            });
  if (!exits.empty()) {
    const std::string path = fmt::format("{}/{}", dump_dir, fr::kExitsFileName);
    std::ofstream out(path, std::ios::trunc);
    out << fr::exits_to_json(exits);
    TESSEL_CHECK(out.good(), IoError, "cannot write {}", path);
  }
  if (report.missing.empty()) {
    log_info(LogComponent::kLauncher, "gathered {} of {} flight-recorder dumps into {}",
             report.gathered.size(), world_size, dump_dir);
  } else {
    log_warn(LogComponent::kLauncher,
             "gathered {} of {} flight-recorder dumps into {}; no answer from {} {}",
             report.gathered.size(), world_size, dump_dir,
             report.missing.size() == 1 ? "rank" : "ranks", fr::format_rank_list(report.missing));
  }
  if (report.gathered.empty()) {
    report.verdict = "no dumps were gathered; tessel-trace not run";
    return report;
  }
  const std::string facts_path = dump_dir + "/verdict.json";
  std::remove(facts_path.c_str());
  try {
    std::tie(report.trace_status, report.verdict) = run_capture(
        {trace_tool, "analyze", dump_dir, "--json-out", facts_path}, std::chrono::seconds(60));
  } catch (const Error& e) {
    report.verdict = fmt::format("could not run '{} analyze': {}", trace_tool, e.message());
  }
  std::ifstream facts(facts_path);
  if (facts) {
    const std::string text((std::istreambuf_iterator<char>(facts)),
                           std::istreambuf_iterator<char>());
    try {
      report.facts = parse_verdict_facts(text, facts_path);
    } catch (const Error& e) {
      log_warn(LogComponent::kLauncher, "{}", e.message());
    }
  }
  return report;
}

std::string trace_status_text(int status) {
  switch (status) {
    case 0:
      return "0 (healthy)";
    case 1:
      return "1 (culprit found)";
    case 2:
      return "2 (inconclusive)";
    case 3:
      return "3 (bad input)";
    default:
      return status < 0 ? "not run" : fmt::format("{} (the analyzer failed)", status);
  }
}

VerdictFacts parse_verdict_facts(std::string_view text, const std::string& name) {
  VerdictFacts f;
  try {
    const auto j = nlohmann::json::parse(text);
    f.status = j.at("status").get<std::string>();
    f.culprits = j.at("culprits").get<std::vector<int>>();
    f.suspects = j.value("suspects", std::vector<int>{});
    const std::string ranks = fr::format_rank_list(f.culprits);
    const char* noun = f.culprits.size() == 1 ? "rank" : "ranks";
    f.status_line = f.status == "culprit_found"  ? fmt::format("CULPRIT FOUND: {} {}", noun, ranks)
                    : f.status == "inconclusive" ? "INCONCLUSIVE"
                                                 : "HEALTHY";
    const auto& findings = j.at("findings");
    if (!findings.empty()) {
      f.evidence.push_back(findings.front().at("summary").get<std::string>());
      for (const auto& d : findings.front().at("details")) {
        f.evidence.push_back(d.get<std::string>());
      }
    } else {
      for (const auto& r : j.value("inconclusive", nlohmann::json::array())) {
        f.evidence.push_back(r.get<std::string>());
      }
    }
    for (const auto& p : j.at("positions")) {
      const int rank = p.at("rank").get<int>();
      f.where[rank] = p.at("where").get<std::string>();
      f.position[rank] = p.at("summary").get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not a tessel-trace verdict: {}", name, e.what()));
  }
  return f;
}

}  // namespace tessel::launcher
