#include "tessel/launcher/root_cause.h"

#include <algorithm>
#include <cstdlib>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/reader.h"
#include "tessel/launcher/failure_report.h"

namespace tessel::launcher {
namespace {

constexpr LogComponent kL = LogComponent::kLauncher;

const WorkerExitRecord* exit_record(const HangReport& r, int rank) {
  for (const auto& e : r.exits) {
    if (e.exit.rank == rank) return &e;
  }
  return nullptr;
}

// The root cause by the workers' own records. The first failure reported to the server is the
// first worker reaped, not the first to fail: a rank that lost a peer (PeerLost, exit 1) may be
// reaped before the rank that crashed or whose collective timed out. A reported root that is
// only such a consequence (its own first failure was not a timeout) gives way to a rank killed
// by a signal, else to the rank whose collective timed out first by its own clock.
std::optional<proto::Failure> first_failure_by_records(const proto::Failure& root,
                                                       const HangReport& r) {
  auto is_timeout = [](const CollectiveFailure& f) { return f.reason.rfind("Timeout", 0) == 0; };
  const CollectiveFailure* own = nullptr;
  for (const auto& f : r.failures) {
    if (f.rank == root.rank()) own = &f;
  }
  if (root.rank() < 0 || own == nullptr || is_timeout(*own) || root.signal() != 0) return {};
  proto::Failure f;
  f.set_hang(true);
  for (const auto& e : r.exits) {
    if (e.exit.signal != 0 && f.reason().empty()) {
      f.set_rank(e.exit.rank);
      f.set_reason("killed by a signal while its peers were in collectives");
    }
  }
  if (f.reason().empty()) {
    const auto first = std::find_if(r.failures.begin(), r.failures.end(), is_timeout);
    if (first == r.failures.end() || first->rank == root.rank()) return {};
    f.set_rank(first->rank);
    f.set_exit_code(kCollectiveTimeoutExitCode);
    f.set_reason(fmt::format("its collective timed out first (by the workers' own clocks): {}",
                             first->reason));
  }
  if (const WorkerExitRecord* e = exit_record(r, f.rank())) {
    f.set_exit_code(std::max(e->exit.exit_code, 0));
    f.set_signal(e->exit.signal);
    f.set_pid(e->pid);
    f.set_local_rank(e->local_rank);
    f.set_host(e->host);
  }
  log_warn(kL, "root cause: rank {} ({}); rank {}, reaped first, only saw the consequence: {}",
           f.rank(), f.reason(), root.rank(), own->reason);
  return f;
}

// The signal number of a fatal-signal dump's reason ("signal 11"), 0 when it names none.
int dump_signal(const fr::RankDump& d) {
  if (d.trigger != fr::DumpTrigger::kFatalSignal || d.reason.rfind("signal ", 0) != 0) return 0;
  return std::atoi(d.reason.c_str() + 7);
}

// The verdict's first culprit as the root cause, with its evidence; the reported failure, when
// it is another rank, as the symptom.
proto::Failure culprit_root_cause(const proto::Failure& reported, const HangReport& r,
                                  const VerdictFacts& v) {
  const int c = v.culprits.front();
  proto::Failure f;
  f.set_hang(true);
  f.set_rank(c);
  f.set_local_rank(-1);
  f.set_verdict(v.status_line);
  for (int x : v.culprits) f.add_culprits(x);
  for (const auto& e : v.evidence) f.add_evidence(e);
  std::optional<fr::RankDump> dump;
  try {
    dump = fr::read_dump(fmt::format("{}/{}", r.dump_dir, fr::dump_file_name(c, 0)));
  } catch (const Error&) {
    // No usable dump of the culprit (killed, never wrote one): its exit record says the rest.
  }
  const WorkerExitRecord* exit = exit_record(r, c);
  if (reported.rank() == c) {
    f.set_node_id(reported.node_id());
    f.set_host(reported.host());
    f.set_addr(reported.addr());
    f.set_group_rank(reported.group_rank());
    f.set_pid(reported.pid());
    f.set_local_rank(reported.local_rank());
    f.set_stderr_tail(reported.stderr_tail());
    f.set_error_file(reported.error_file());
  } else if (exit != nullptr) {
    f.set_host(exit->host);
    f.set_pid(exit->pid);
    f.set_local_rank(exit->local_rank);
  } else if (dump) {
    f.set_host(dump->hostname);
    f.set_pid(dump->pid);
  } else if (const auto pid = r.missing_pids.find(c); pid != r.missing_pids.end()) {
    f.set_pid(pid->second);  // it never answered: stopped, or busy outside tessel's calls
  }
  const auto where_it = v.where.find(c);
  const std::string where = where_it == v.where.end() ? "" : where_it->second;
  const auto pos_it = v.position.find(c);
  const std::string position = pos_it == v.position.end() ? "" : pos_it->second;
  // How it ended decides the exit status: a rank that crashed, was killed or exited keeps its
  // own status; one that was alive and did not take part hung the job (124).
  int signal = exit != nullptr ? exit->exit.signal : 0;
  if (where == "crashed" && signal == 0 && dump) signal = dump_signal(*dump);
  const bool ended = where == "crashed" || where == "exited" || where == "no_dump";
  if (ended && signal != 0) {
    f.set_signal(signal);
    f.set_reason(position.empty() ? "killed by " + signal_name(signal) : position);
  } else if (ended && exit != nullptr) {
    f.set_exit_code(std::max(exit->exit.exit_code, 0));
    f.set_reason(position.empty() ? fmt::format("exited with code {}", exit->exit.exit_code)
                                  : position);
  } else {
    f.set_exit_code(kCollectiveTimeoutExitCode);
    f.set_reason(position.empty() ? "did not take part in the collective its peers waited in"
                                  : "hung: " + position);
  }
  if (reported.rank() >= 0 && reported.rank() != c) {
    // The first failure in time, which the verdict explains as a consequence.
    f.set_symptom(one_line_root_cause(reported));
    f.set_symptom_rank(reported.rank());
    f.set_stderr_tail(reported.stderr_tail());
    if (f.node_id().empty() && f.host() == reported.host()) f.set_node_id(reported.node_id());
  }
  log_warn(kL, "root cause by the flight recorder's verdict ({}): rank {}; {}", v.status_line, c,
           reported.rank() != c
               ? fmt::format("rank {}, the first to fail, waited on it", reported.rank())
               : "it was also the first to fail");
  return f;
}

}  // namespace

std::optional<proto::Failure> hang_root_cause(const proto::Failure& reported,
                                              const HangReport& report) {
  try {
    if (report.facts && report.facts->status == "culprit_found" &&
        !report.facts->culprits.empty()) {
      return culprit_root_cause(reported, report, *report.facts);
    }
    std::optional<proto::Failure> f = first_failure_by_records(reported, report);
    if (report.facts) {
      // A verdict that names nobody: the root cause stays the workers' first failure, and the
      // report says why the flight recorder did not decide.
      if (!f) f = reported;
      f->set_verdict(report.facts->status_line);
      for (const auto& e : report.facts->evidence) f->add_evidence(e);
    }
    return f;
  } catch (const std::exception& e) {
    log_error(kL, "deriving the root cause from the verdict failed: {}", e.what());
    return std::nullopt;
  }
}

}  // namespace tessel::launcher
