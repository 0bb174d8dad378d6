#include "tessel/launcher/failure_report.h"

#include <string.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessel/base/error.h"
#include "tessel/launcher/exit_codes.h"

namespace tessel::launcher {

std::string signal_name(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  if (abbrev == nullptr) return fmt::format("signal {}", signal);
  return std::string("SIG") + abbrev;
}

int root_cause_exit_status(const proto::Failure& f) {
  if (f.signal() != 0) return 128 + f.signal();
  if (f.rank() < 0 || f.exit_code() == 0) return 1;
  return f.exit_code();
}

namespace {

std::string what_happened(const proto::Failure& f) {
  if (!f.culprits().empty()) return f.reason();  // the verdict's words for where it was
  if (f.signal() != 0) return fmt::format("killed by {}", signal_name(f.signal()));
  if (f.rank() < 0) return f.reason();
  if (f.reason() == "exited" || f.reason().empty()) {
    return fmt::format("exited with code {}", f.exit_code());
  }
  return fmt::format("{} (exit code {})", f.reason(), f.exit_code());
}

}  // namespace

std::string utc_time(int64_t us) {
  const time_t secs = static_cast<time_t>(us / 1000000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &t);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>((us / 1000) % 1000));
}

std::string node_label(const proto::Failure& f) {
  if (f.addr().empty()) return fmt::format("host {}", f.host());
  if (f.group_rank() < 0) return fmt::format("{} (host {})", f.addr(), f.host());
  return fmt::format("node {} ({}, host {})", f.group_rank(), f.addr(), f.host());
}

std::string one_line_root_cause(const proto::Failure& f) {
  if (f.rank() >= 0) {
    return fmt::format("round {}: rank {} (local rank {}) on {}, pid {}: {}", f.round(), f.rank(),
                       f.local_rank(), node_label(f), f.pid(), what_happened(f));
  }
  return fmt::format("round {}: {}: {}", f.round(), node_label(f), what_happened(f));
}

namespace {

// "rank 3 (local rank 1) on node 1 (...), pid 42": local rank, node and pid where known.
std::string rank_label(const proto::Failure& f) {
  std::string out = fmt::format("rank {}", f.rank());
  if (f.local_rank() >= 0) out += fmt::format(" (local rank {})", f.local_rank());
  if (!f.host().empty() || !f.addr().empty()) out += " on " + node_label(f);
  if (f.pid() > 0) out += fmt::format(", pid {}", f.pid());
  return out;
}

}  // namespace

std::string format_failure_report(const proto::Failure& f, int restart_count, int max_restarts) {
  const bool named = !f.culprits().empty();
  std::string out =
      named ? fmt::format(
                  "tessel-run: job failed after {} of {} restarts; root cause (the flight "
                  "recorder's verdict, {}; round {}, {}):\n",
                  restart_count, max_restarts, f.verdict(), f.round(), utc_time(f.server_time_us()))
            : fmt::format(
                  "tessel-run: job failed after {} of {} restarts; root cause (first failure by "
                  "the server's clock, {}, round {}):\n",
                  restart_count, max_restarts, utc_time(f.server_time_us()), f.round());
  if (f.rank() >= 0) {
    out += fmt::format("  {}: {}\n", rank_label(f), what_happened(f));
  } else {
    out += fmt::format("  {}: {}\n", node_label(f), what_happened(f));
  }
  if (!f.evidence().empty()) {
    out += named ? "  evidence:\n"
                 : fmt::format(
                       "  the flight recorder's verdict is {}, so the root cause above is "
                       "the workers' first failure:\n",
                       f.verdict());
    for (int i = 0; i < f.evidence_size(); ++i) {
      out += fmt::format("    {}{}\n", i == 0 ? "" : "- ", f.evidence(i));
    }
  }
  if (!f.symptom().empty()) {
    out +=
        fmt::format("  first failure in time (a consequence, by the verdict): {}\n", f.symptom());
  }
  for (const proto::Exclusion& x : f.excluded()) {
    out += fmt::format("  taken out of the job: node {} ({}, host {})\n", x.group_rank(), x.addr(),
                       x.host());
  }
  if (!f.outcome_note().empty()) out += fmt::format("  {}\n", f.outcome_note());
  if (!f.error_file().empty()) {
    out += "  its error file (TORCHELASTIC_ERROR_FILE):\n";
    size_t pos = 0;
    const std::string& t = f.error_file();
    while (pos < t.size()) {
      const size_t nl = std::min(t.find('\n', pos), t.size());
      out += "    | " + t.substr(pos, nl - pos) + "\n";
      pos = nl + 1;
    }
  }
  if (!f.stderr_tail().empty()) {
    out += f.symptom().empty()
               ? "  last lines of its stderr:\n"
               : fmt::format("  last lines of rank {}'s stderr:\n", f.symptom_rank());
    size_t pos = 0;
    const std::string& t = f.stderr_tail();
    while (pos <= t.size()) {
      const size_t nl = std::min(t.find('\n', pos), t.size());
      out += "    | " + t.substr(pos, nl - pos) + "\n";
      pos = nl + 1;
    }
  }
  out += fmt::format("  tessel-run exits with status {}\n", root_cause_exit_status(f));
  return out;
}

std::string failure_report_json(const proto::Failure& f, int restart_count) {
  nlohmann::json excluded = nlohmann::json::array();
  for (const proto::Exclusion& x : f.excluded()) {
    excluded.push_back({{"host", x.host()},
                        {"addr", x.addr()},
                        {"group_rank", x.group_rank()},
                        {"round", x.round()},
                        {"ranks", std::vector<int>(x.ranks().begin(), x.ranks().end())},
                        {"reason", x.reason()}});
  }
  nlohmann::json j = {
      {"host", f.host()},
      {"node_id", f.node_id()},
      {"addr", f.addr()},
      {"group_rank", f.addr().empty() ? -1 : f.group_rank()},
      {"error_file", f.error_file()},
      {"rank", f.rank()},
      {"local_rank", f.local_rank()},
      {"pid", f.pid()},
      {"exit_code", f.exit_code()},
      {"signal", f.signal()},
      {"signal_name", f.signal() != 0 ? signal_name(f.signal()) : ""},
      {"reason", f.reason()},
      {"stderr_tail", f.stderr_tail()},
      {"server_time_us", f.server_time_us()},
      {"server_time", utc_time(f.server_time_us())},
      {"round", f.round()},
      {"restart_count", restart_count},
      {"exit_status", root_cause_exit_status(f)},
      // The flight recorder's verdict on a hang ("" / empty when the hang path did not run).
      {"verdict", f.verdict()},
      {"culprits", std::vector<int>(f.culprits().begin(), f.culprits().end())},
      {"evidence", std::vector<std::string>(f.evidence().begin(), f.evidence().end())},
      {"symptom", f.symptom()},
      {"symptom_rank", f.symptom().empty() ? -1 : f.symptom_rank()},
      // The closed loop: nodes this failure took out of the job, and why it could not go on.
      {"excluded", excluded},
      {"outcome_note", f.outcome_note()},
  };
  return j.dump(2) + "\n";
}

void write_failure_report(const std::string& path, const proto::Failure& f, int restart_count) {
  std::ofstream out(path, std::ios::trunc);
  TESSEL_CHECK(out.good(), IoError, "cannot write the failure report {}", path);
  out << failure_report_json(f, restart_count);
  TESSEL_CHECK(out.good(), IoError, "writing the failure report {} failed", path);
}

}  // namespace tessel::launcher
