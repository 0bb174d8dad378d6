#include "tessel/launcher/hang_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/store.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/dumper.h"
#include "tessel/launcher/worker_group.h"

namespace tessel::launcher {

// How long fetch_dump waits for the newest answer before looking at older ones again.
constexpr Nanoseconds kFetchSlice = std::chrono::milliseconds(200);

StoreDumpChannel::StoreDumpChannel(std::shared_ptr<Store> store) : store_(std::move(store)) {}

void StoreDumpChannel::request_dumps(int64_t round, const std::string& reason) {
  const int64_t n = store_->add(std::string(fr::kStoreDumpCounterKey), 1);
  store_->set(fr::store_dump_request_key(n),
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

std::pair<int, std::string> run_capture(const std::vector<std::string>& argv,
                                        Nanoseconds timeout) {
  TESSEL_CHECK(!argv.empty(), InvalidArgument, "run_capture needs a program");
  const char* path_env = std::getenv("PATH");
  const std::string program = resolve_program(argv[0], path_env ? path_env : "/usr/bin:/bin");
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
  for (int rank = 0; rank < world_size; ++rank) {
    auto dump = channel.fetch_dump(rank, deadline.remaining());
    if (!dump) {
      report.missing.push_back(rank);
      continue;
    }
    const std::string path = fmt::format("{}/{}", dump_dir, fr::dump_file_name(rank, 0));
    std::ofstream out(path, std::ios::trunc);
    out << *dump;
    TESSEL_CHECK(out.good(), IoError, "cannot write flight-recorder dump {}", path);
    report.gathered.push_back(rank);
  }
  log_warn(LogComponent::kLauncher, "gathered {} of {} flight-recorder dumps into {}",
           report.gathered.size(), world_size, dump_dir);
  if (report.gathered.empty()) {
    report.verdict = "no dumps were gathered; tessel-trace not run";
    return report;
  }
  try {
    std::tie(report.trace_status, report.verdict) =
        run_capture({trace_tool, "analyze", dump_dir}, std::chrono::seconds(60));
  } catch (const Error& e) {
    report.verdict = fmt::format("could not run '{} analyze': {}", trace_tool, e.message());
  }
  return report;
}

}  // namespace tessel::launcher
