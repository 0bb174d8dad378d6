#pragma once
// Test helper: runs a command as a child with its output in files, waits on it with a deadline
// (pidfd + poll, no sleeping), and scans /proc for leftover processes.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessel::launcher::testing {

class ChildProcess {
 public:
  // Starts argv with extra "NAME=value" environment entries; stdout and stderr go to
  // <out_prefix>.out / .err.
  ChildProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
               const std::string& out_prefix);
  ~ChildProcess();  // SIGKILL if still running, then reaps
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Exit status (code, or 128 + signal) once it ended, nullopt if still running at the deadline.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  void signal(int sig);
  std::string out() const;
  std::string err() const;

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<int> status_;
  std::string prefix_;
};

std::string read_file(const std::string& path);
// A fresh directory under the test temp dir.
std::string make_temp_dir(const std::string& tag);
// Live (non-zombie) pids whose environment contains `entry` ("NAME=value").
std::vector<pid_t> pids_with_env(const std::string& entry);
bool process_alive(pid_t pid);
// A pidfd for `pid` (-1 when it has ended). Open it while the process is known to be the one
// meant: a pid is reused once its process is reaped (pid_max is 32,768 here, and a loaded
// machine cycles through that in seconds), a pidfd never refers to another process.
int open_pidfd(pid_t pid);
// Waits until the process behind PIDFD has ended (a zombie not yet reaped counts as ended).
bool wait_pidfd_exited(int pidfd, std::chrono::milliseconds timeout);
// "/proc/PID/stat state R (comm)" for messages: what a process said to be alive is doing.
std::string describe_process(pid_t pid);
// Polls `cond` on inotify-free ground: waits on a pidfd-less condition by re-checking every
// 10 ms up to the deadline. Returns whether it became true. (Used for file and /proc state,
// which offer no event to wait on.)
bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds timeout);
// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, close).
int free_port();

}  // namespace tessel::launcher::testing
