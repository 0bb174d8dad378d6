#include "fork_harness.h"

#include <fmt/format.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "tessel/base/error.h"

namespace tessel::testing {

std::vector<ProcessOutcome> run_processes(
    int count, const std::function<void(int rank, const std::string& store_dir)>& fn,
    Nanoseconds deadline_after) {
  char pattern[] = "/tmp/tessel-fork-XXXXXX";
  const char* dir = ::mkdtemp(pattern);
  if (dir == nullptr) throw_system_error("mkdtemp", errno);
  const std::string store_dir = dir;

  std::vector<pid_t> pids;
  for (int rank = 0; rank < count; ++rank) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw_system_error("fork", errno);
    if (pid == 0) {
      int code = 0;
      try {
        fn(rank, store_dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);  // skip the parent's atexit handlers and static destructors
    }
    pids.push_back(pid);
  }

  std::vector<ProcessOutcome> outcomes(static_cast<size_t>(count));
  std::vector<bool> done(static_cast<size_t>(count), false);
  int remaining = count;
  const Deadline deadline = Deadline::after(deadline_after);
  while (remaining > 0 && !deadline.expired()) {
    for (int r = 0; r < count; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        auto& o = outcomes[r];
        o.rank = r;
        o.exited = WIFEXITED(status);
        o.exit_code = o.exited ? WEXITSTATUS(status) : -1;
        o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        done[r] = true;
        --remaining;
      }
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < count; ++r) {
    if (done[r]) continue;
    ::kill(pids[r], SIGKILL);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    outcomes[r] = ProcessOutcome{.rank = r, .signal = SIGKILL, .timed_out = true};
  }
  std::error_code ec;
  std::filesystem::remove_all(store_dir, ec);
  return outcomes;
}

std::string describe(const ProcessOutcome& o) {
  if (o.timed_out) return fmt::format("rank {}: killed at the deadline", o.rank);
  if (o.exited) return fmt::format("rank {}: exit {}", o.rank, o.exit_code);
  return fmt::format("rank {}: signal {}", o.rank, o.signal);
}

}  // namespace tessel::testing
