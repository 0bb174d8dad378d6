#include "tessel/launcher/worker_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "tessel/base/logging.h"

namespace tessel::launcher {
namespace {

constexpr auto kL = LogComponent::kLauncher;
constexpr uint64_t kSigchldTag = ~uint64_t{0};
constexpr uint64_t kExternalBit = uint64_t{1} << 62;
constexpr auto kDrainLimit = std::chrono::milliseconds(200);

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

int block_agent_signals() {
  sigset_t all;
  sigemptyset(&all);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&all, s);
  if (pthread_sigmask(SIG_BLOCK, &all, nullptr) != 0) throw_system_error("pthread_sigmask", errno);
  sigset_t agent = all;
  sigdelset(&agent, SIGCHLD);
  const int fd = signalfd(-1, &agent, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) throw_system_error("signalfd", errno);
  return fd;
}

std::vector<pid_t> processes_with_marker(const std::string& marker) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == getpid()) continue;
    std::ifstream in(fmt::format("/proc/{}/environ", pid), std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t pos = 0;
    while (pos < env.size()) {
      const size_t nul = std::min(env.find('\0', pos), env.size());
      if (env.compare(pos, nul - pos, marker) == 0) {
        // Zombies keep their environ readable only while alive; skip those already dead.
        std::ifstream stat(fmt::format("/proc/{}/stat", pid));
        std::string line;
        std::getline(stat, line);
        const size_t paren = line.rfind(')');
        if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z') {
          found.push_back(static_cast<pid_t>(pid));
        }
        break;
      }
      pos = nul + 1;
    }
  }
  closedir(proc);
  return found;
}

// ---- OrphanGuard ----------------------------------------------------------------------------

OrphanGuard::OrphanGuard(std::string agent_id) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw_system_error("pipe2 for the orphan guard", errno);
  const std::string marker = "TESSEL_AGENT_ID=" + agent_id;
  pid_ = fork();
  if (pid_ < 0) throw_system_error("fork of the orphan guard", errno);
  if (pid_ == 0) {
    // The guardian: outlives a killed agent just long enough to kill the job's processes.
    ::close(fds[1]);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) signal(s, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::string text;
    char buf[512];
    for (;;) {
      const ssize_t n = ::read(fds[0], buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    if (text.find("done\n") != std::string::npos) _exit(0);
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t nl = std::min(text.find('\n', pos), text.size());
      const long pgid = std::strtol(text.c_str() + pos, nullptr, 10);
      if (pgid > 1) kill(static_cast<pid_t>(-pgid), SIGKILL);
      pos = nl + 1;
    }
    // Descendants that left their process group still carry the agent's marker.
    for (int pass = 0; pass < 50; ++pass) {
      const auto pids = processes_with_marker(marker);
      if (pids.empty()) break;
      for (pid_t p : pids) kill(p, SIGKILL);
      usleep(20000);  // the guardian has no event to wait on; bounded by 50 passes
    }
    _exit(0);
  }
  ::close(fds[0]);
  write_fd_ = fds[1];
}

OrphanGuard::~OrphanGuard() {
  if (write_fd_ >= 0) {
    write_all(write_fd_, "done\n");
    ::close(write_fd_);
  }
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

void OrphanGuard::watch_process_group(pid_t pgid) {
  write_all(write_fd_, fmt::format("{}\n", pgid));
}

// ---- WorkerGroup ----------------------------------------------------------------------------

struct WorkerGroup::Worker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  LineSplitter out_lines, err_lines;
  std::optional<WorkerExit> exit;
  SteadyClock::time_point exited_at;
  bool returned = false;
};

WorkerGroup::WorkerGroup(std::string program_path, std::vector<std::string> args, LogMux* mux,
                         OrphanGuard* guard)
    : program_(std::move(program_path)), args_(std::move(args)), mux_(mux), guard_(guard) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) throw_system_error("PR_SET_CHILD_SUBREAPER", errno);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw_system_error("epoll_create1", errno);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigchld_fd_ = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigchld_fd_ < 0) throw_system_error("signalfd(SIGCHLD)", errno);
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = kSigchldTag}};
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, sigchld_fd_, &ev) != 0) {
    throw_system_error("epoll_ctl(signalfd)", errno);
  }
}

WorkerGroup::~WorkerGroup() {
  kill_all();
  for (auto& w : workers_) {
    close_fd(w->out_fd);
    close_fd(w->err_fd);
  }
  close_fd(sigchld_fd_);
  close_fd(epoll_fd_);
}

void WorkerGroup::add_external_fd(int fd) {
  epoll_event ev{.events = EPOLLIN, .data = {.u64 = kExternalBit | static_cast<uint64_t>(fd)}};
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) throw_system_error("epoll_ctl", errno);
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs) {
  for (auto& w : workers_) {
    close_fd(w->out_fd);
    close_fd(w->err_fd);
  }
  workers_.clear();
  // Everything the child needs is built before fork: between fork and exec it only makes
  // async-signal-safe calls (other threads may hold malloc's lock).
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program_.c_str()));
  for (auto& a : args_) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  for (const WorkerSpec& spec : specs) {
    std::vector<char*> envp;
    for (auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int out[2], err[2], status_pipe[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
        pipe2(status_pipe, O_CLOEXEC) != 0) {
      throw_system_error("pipe2 for a worker", errno);
    }
    const pid_t pid = fork();
    if (pid < 0) throw_system_error("fork of a worker", errno);
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the agent died before the line above
      signal(SIGPIPE, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(argv[0], argv.data(), envp.data());
      const int e = errno;
      (void)!::write(status_pipe[1], &e, sizeof(e));
      _exit(127);
    }
    setpgid(pid, pid);  // also here, so the group exists before we signal it
    guard_->watch_process_group(pid);
    ::close(out[1]);
    ::close(err[1]);
    ::close(status_pipe[1]);
    int exec_errno = 0;
    ssize_t n;
    do {
      n = ::read(status_pipe[0], &exec_errno, sizeof(exec_errno));
    } while (n < 0 && errno == EINTR);
    ::close(status_pipe[0]);
    auto w = std::make_unique<Worker>();
    w->local_rank = spec.local_rank;
    w->global_rank = spec.global_rank;
    w->pid = pid;
    w->out_fd = out[0];
    w->err_fd = err[0];
    const size_t index = workers_.size();
    for (auto [fd, is_err] : {std::pair{w->out_fd, 0}, std::pair{w->err_fd, 1}}) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      epoll_event ev{.events = EPOLLIN,
                     .data = {.u64 = (index << 1) | static_cast<uint64_t>(is_err)}};
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) throw_system_error("epoll_ctl", errno);
    }
    workers_.push_back(std::move(w));
    if (n > 0) {
      kill_all();
      throw ProgramError(
          fmt::format("cannot execute '{}': {}", program_, std::strerror(exec_errno)),
          exec_errno == ENOENT ? 127 : 126);
    }
    log_debug(kL, "worker rank {} (local {}) started, pid {}", spec.global_rank, spec.local_rank,
              pid);
  }
}

void WorkerGroup::read_pipe(size_t index, bool is_err) {
  Worker& w = *workers_[index];
  int& fd = is_err ? w.err_fd : w.out_fd;
  LineSplitter& lines = is_err ? w.err_lines : w.out_lines;
  const WorkerStream stream = is_err ? WorkerStream::kStderr : WorkerStream::kStdout;
  const auto emit = [&](std::string_view line) {
    mux_->write_line(w.local_rank, w.global_rank, stream, line);
  };
  char buf[65536];
  for (int rounds = 0; rounds < 16 && fd >= 0; ++rounds) {  // bounded: stay fair to others
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      lines.feed(std::string_view(buf, static_cast<size_t>(n)), emit);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    lines.finish(emit);  // EOF or error: the stream is over
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close_fd(fd);
  }
}

void WorkerGroup::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& w : workers_) {
      if (w->pid != pid || w->exit) continue;
      WorkerExit e{w->local_rank, w->global_rank, pid, 0, 0};
      if (WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
      w->exit = e;
      w->exited_at = SteadyClock::now();
    }
    // Other pids are orphaned grandchildren reparented to us (subreaper): reaped, nothing else.
  }
}

WorkerEvents WorkerGroup::wait(Deadline deadline) {
  WorkerEvents events;
  for (;;) {
    // Exits whose output is drained (or waited on long enough) are ready.
    const auto now = SteadyClock::now();
    auto next_drain = SteadyClock::time_point::max();
    for (auto& w : workers_) {
      if (!w->exit || w->returned) continue;
      const bool drained = w->out_fd < 0 && w->err_fd < 0;
      if (drained || now - w->exited_at >= kDrainLimit) {
        if (!drained) {
          for (bool is_err : {false, true}) {
            LineSplitter& l = is_err ? w->err_lines : w->out_lines;
            l.finish([&](std::string_view line) {
              mux_->write_line(w->local_rank, w->global_rank,
                               is_err ? WorkerStream::kStderr : WorkerStream::kStdout, line);
            });
          }
        }
        w->returned = true;
        events.exits.push_back(*w->exit);
      } else {
        next_drain = std::min(next_drain, w->exited_at + kDrainLimit);
      }
    }
    if (!events.exits.empty() || !events.ready_fds.empty()) return events;
    auto until = std::min(next_drain, deadline.when());
    int timeout_ms = -1;
    if (until != SteadyClock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - SteadyClock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    if (timeout_ms == 0 && deadline.expired()) return events;
    epoll_event ready[64];
    const int n = epoll_wait(epoll_fd_, ready, 64, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_system_error("epoll_wait", errno);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = ready[i].data.u64;
      if (tag == kSigchldTag) {
        signalfd_siginfo info;
        while (::read(sigchld_fd_, &info, sizeof(info)) > 0) {
        }
        reap();
      } else if ((tag & kExternalBit) != 0) {
        events.ready_fds.push_back(static_cast<int>(tag & ~kExternalBit));
      } else if ((tag >> 1) < workers_.size()) {
        read_pipe(tag >> 1, (tag & 1) != 0);
      }
    }
    if (n == 0 && deadline.expired()) return events;
  }
}

void WorkerGroup::signal_all(int sig) {
  for (auto& w : workers_) {
    if (!w->exit) kill(-w->pid, sig);
  }
}

int WorkerGroup::running() const {
  int n = 0;
  for (auto& w : workers_) n += w->returned ? 0 : 1;
  return n;
}

pid_t WorkerGroup::pid_of(int local_rank) const {
  for (auto& w : workers_) {
    if (w->local_rank == local_rank) return w->pid;
  }
  return -1;
}

std::vector<WorkerExit> WorkerGroup::stop_all(Deadline term) {
  std::vector<WorkerExit> seen;
  signal_all(SIGTERM);
  while (running() > 0 && !term.expired()) {
    auto ev = wait(term);
    seen.insert(seen.end(), ev.exits.begin(), ev.exits.end());
  }
  if (running() > 0) {
    for (auto& w : workers_) kill(-w->pid, SIGKILL);  // the group: also its children
    const Deadline reap_deadline = Deadline::after(std::chrono::seconds(5));
    while (running() > 0 && !reap_deadline.expired()) {
      auto ev = wait(reap_deadline);
      seen.insert(seen.end(), ev.exits.begin(), ev.exits.end());
    }
  }
  kill_descendants();
  return seen;
}

void WorkerGroup::kill_all() {
  for (auto& w : workers_) kill(-w->pid, SIGKILL);
  const Deadline deadline = Deadline::after(std::chrono::seconds(5));
  while (running() > 0 && !deadline.expired()) wait(deadline);
  kill_descendants();
}

// Kills what is left below us: workers' children that left their process group were
// reparented to this subreaper.
void WorkerGroup::kill_descendants() {
  for (auto& w : workers_) kill(-w->pid, SIGKILL);
  const pid_t self = getpid();
  const pid_t guard = guard_ != nullptr ? guard_->pid() : -1;
  for (int pass = 0; pass < 20; ++pass) {
    bool any = false;
    DIR* proc = opendir("/proc");
    if (proc == nullptr) return;
    while (dirent* e = readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (*end != '\0' || pid <= 0 || pid == guard) continue;
      std::ifstream stat(fmt::format("/proc/{}/stat", pid));
      std::string line;
      std::getline(stat, line);
      const size_t paren = line.rfind(')');
      if (paren == std::string::npos) continue;
      char state = 0;
      long ppid = 0;
      if (sscanf(line.c_str() + paren + 1, " %c %ld", &state, &ppid) != 2) continue;
      if (ppid != self) continue;
      any = true;
      if (state != 'Z') kill(static_cast<pid_t>(pid), SIGKILL);
    }
    closedir(proc);
    // Reap the killed orphans (workers' exits are recorded on the way).
    for (int tries = 0; tries < 50; ++tries) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid == guard) continue;
      if (pid <= 0) break;
      for (auto& w : workers_) {
        if (w->pid == pid && !w->exit) {
          w->exit = WorkerExit{w->local_rank, w->global_rank, pid, 0, 0};
          if (WIFEXITED(status)) w->exit->exit_code = WEXITSTATUS(status);
          if (WIFSIGNALED(status)) w->exit->signal = WTERMSIG(status);
          w->exited_at = SteadyClock::now();
        }
      }
    }
    if (!any) return;
    siginfo_t info{};
    // Block until one more child changes state, bounded by the pass count.
    waitid(P_ALL, 0, &info, WEXITED | WNOWAIT);
  }
}

}  // namespace tessel::launcher
