#pragma once
// The workers of one node: spawned with their environment in their own process groups with a
// parent-death signal, their output read line by line into a LogMux, and their exits noticed
// by events (SIGCHLD through a signalfd, pipes, all in one epoll), never by polling. The
// calling process becomes a child subreaper, so orphaned grandchildren are reparented to it
// and killed with the job.
//
// OrphanGuard covers the case where the agent itself is killed with SIGKILL: a small guardian
// process, forked before any thread exists, holds the read end of a pipe from the agent; on EOF
// it kills every worker process group it was told about and every process carrying the agent's
// marker (TESSEL_AGENT_ID=<id> in /proc/<pid>/environ), which catches descendants that left
// their process group.
//
// Not thread-safe: WorkerGroup is driven by the agent's main thread, which must be the thread
// that spawns (the parent-death signal follows the spawning thread).

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/launcher/exec_path.h"
#include "tessel/launcher/log_mux.h"

namespace tessel::launcher {

struct WorkerSpec {
  int local_rank = 0;
  int global_rank = 0;
  std::vector<std::string> env;  // complete environment, "NAME=value"
};

struct WorkerExit {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it
  bool success() const { return signal == 0 && exit_code == 0; }
};

// What WorkerGroup::wait returned: finished workers (their output drained) and ready
// external fds.
struct WorkerEvents {
  std::vector<WorkerExit> exits;
  std::vector<int> ready_fds;
};

class OrphanGuard {
 public:
  // Forks the guardian. Call before starting threads. Throws IoError.
  explicit OrphanGuard(std::string agent_id);
  // Tells the guardian the job ended cleanly and reaps it.
  ~OrphanGuard();
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // Adds a process group for the guardian to kill if the agent dies.
  void watch_process_group(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1;
};

class WorkerGroup {
 public:
  // Makes this process a child subreaper and sets up the epoll and the SIGCHLD signalfd.
  // SIGCHLD must already be blocked in every thread (block_agent_signals()).
  WorkerGroup(std::string program_path, std::vector<std::string> args, LogMux* mux,
              OrphanGuard* guard);
  ~WorkerGroup();  // kill_all()
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Spawns one worker per spec. Throws ProgramError (exec failed) or IoError.
  void start(const std::vector<WorkerSpec>& specs);
  // Watches an extra readable fd (signalfd, eventfd) in the same epoll.
  void add_external_fd(int fd);
  // Waits for exits and external fds until something happens or the deadline passes. Worker
  // output read on the way is written to the LogMux. An exit is returned once its pipes reached
  // EOF, or 200 ms after the exit (a grandchild may hold them open).
  WorkerEvents wait(Deadline deadline);

  // Sends sig to every live worker's process group.
  void signal_all(int sig);
  // SIGTERM to every process group, SIGKILL at `kill_at`, then waits (bounded) for the workers
  // and kills any remaining descendant. Returns the exits it saw.
  std::vector<WorkerExit> stop_all(Deadline kill_at);
  std::vector<WorkerExit> stop_all(std::chrono::milliseconds grace) {
    return stop_all(Deadline::after(grace));
  }
  // SIGKILL to every process group and every descendant; reaps what it can.
  void kill_all();

  int running() const;
  pid_t pid_of(int local_rank) const;

 private:
  struct Worker;
  void reap();
  void read_pipe(size_t index, bool is_err);
  void kill_descendants();

  std::string program_;
  std::vector<std::string> args_;
  LogMux* mux_;
  OrphanGuard* guard_;
  int epoll_fd_ = -1;
  int sigchld_fd_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 in the calling thread (call in
// main() before any thread starts, so every thread inherits it) and returns a signalfd
// delivering SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2. Throws IoError.
int block_agent_signals();

// Pids of live processes whose environment holds `marker` ("NAME=value"), excluding self.
std::vector<pid_t> processes_with_marker(const std::string& marker);

}  // namespace tessel::launcher
