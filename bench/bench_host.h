#pragma once
// What benchmarks share about the machine they run on and how they time on it: the CPU's model
// and vector features (/proc/cpuinfo), the load average (/proc/loadavg), CPU-time counters,
// alternating timing rounds that start only once no helper thread still spins, and a peer
// process (PyTorch, say) driven one command line at a time over pipes.

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessel::bench {

// "1.23 0.98 0.75": the 1, 5 and 15 minute load averages.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// "<model name>; f1 f2 ...": the CPU's model and those of `features` (cpuinfo flag names) it
// reports.
inline std::string cpu_features(std::initializer_list<const char*> features) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    if (line.rfind("model name", 0) == 0) model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) flags = " " + line.substr(line.find(':') + 2) + " ";
  }
  std::string out = model + ";";
  for (const char* f : features) {
    if (flags.find(" " + std::string(f) + " ") != std::string::npos) out += " " + std::string(f);
  }
  return out;
}

// CPU seconds of the calling thread.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Process CPU seconds (all threads, user + system): on a shared machine, work per CPU-second
// shows a kernel's efficiency while it runs, whatever the other load.
inline double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// CPU seconds (user + system) of another process, from /proc/PID/stat; 0 when pid <= 0.
inline double process_cpu_seconds(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds burnt, while this thread sleeps `idle`, by this process's other threads and by
// the process `other` (a peer, or none).
inline double background_cpu_seconds(std::chrono::milliseconds idle, pid_t other) {
  const double c0 = cpu_seconds(), t0 = thread_cpu_seconds(), o0 = process_cpu_seconds(other);
  std::this_thread::sleep_for(idle);
  return (cpu_seconds() - c0) - (thread_cpu_seconds() - t0) + process_cpu_seconds(other) - o0;
}

// Waits (up to 3 s) until no other thread of this process, and no thread of `other`, burns CPU:
// OpenBLAS's workers and OpenMP's (PyTorch's) keep spinning for a while after each call and
// would otherwise share the cores with, and be charged to, the next contender timed. (/proc
// counts in clock ticks, hence slices of 50 ms.) Returns false on timeout.
inline bool wait_until_quiet(pid_t other = 0) {
  constexpr auto kSlice = std::chrono::milliseconds(50);
  for (int i = 0; i < 60; ++i) {
    if (background_cpu_seconds(kSlice, other) <
        0.05 * std::chrono::duration<double>(kSlice).count() + (other > 0 ? 0.011 : 0.0)) {
      return true;
    }
  }
  return false;
}

// Per-call times of one contender, gathered over alternating rounds.
struct Calls {
  std::vector<double> walls, cpus;  // seconds; CPU seconds of the process (all threads)
  bool warm = false;
};

// A contender's calls summarised.
struct Timing {
  double wall = NAN;                    // median over the timed calls, seconds
  double cpu = NAN;                     // median CPU seconds of the process per call
  double wall_lo = NAN, wall_hi = NAN;  // fastest and slowest call
  int calls = 0;
};

inline double median(std::vector<double> x) {
  if (x.empty()) return NAN;
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

inline Timing summarize(const Calls& calls) {
  Timing t;
  if (calls.walls.empty()) return t;
  t.wall = median(calls.walls);
  t.cpu = median(calls.cpus);
  t.wall_lo = *std::min_element(calls.walls.begin(), calls.walls.end());
  t.wall_hi = *std::max_element(calls.walls.begin(), calls.walls.end());
  t.calls = static_cast<int>(calls.walls.size());
  return t;
}

// One round of fn: once the process (and `other`, a peer process, if given) is quiet (see
// wait_until_quiet), a warm-up call the first time, then at least `iters` calls lasting at
// least `min_seconds` in all, each timed alone.
inline void time_round(int iters, double min_seconds, const std::function<void()>& fn, Calls& calls,
                       pid_t other = 0) {
  if (!wait_until_quiet(other)) std::fprintf(stderr, "warning: background threads still busy\n");
  if (!calls.warm) fn();
  calls.warm = true;
  double total = 0;
  for (int n = 0; n < iters || total < min_seconds; ++n) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    calls.cpus.push_back(cpu_seconds() - c0);
    calls.walls.push_back(wall);
    total += wall;
  }
}

// Appends the "wall:cpu wall:cpu ..." pairs of seconds a peer answers with to `calls`.
inline void append_peer_times(const std::string& line, Calls& calls) {
  std::istringstream times(line);
  for (std::string pair; times >> pair;) {
    calls.walls.push_back(std::stod(pair.substr(0, pair.find(':'))));
    calls.cpus.push_back(std::stod(pair.substr(pair.find(':') + 1)));
  }
}

// A child process running `python script args...` that reads one command per line on stdin and
// answers one line per command on stdout (its stderr is ours). Not thread-safe; the destructor
// closes its input and waits for it.
class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() { stop(); }

  // Starts the child; false when fork or pipe fails (exec failures show as a missing first line).
  bool start(const std::string& python, const std::vector<std::string>& args) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0) return false;
    if (pipe(from_child) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      return false;
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
      std::vector<char*> argv = {const_cast<char*>(python.c_str())};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(python.c_str(), argv.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    return pid_ > 0;
  }

  pid_t pid() const { return pid_; }

  bool send(const std::string& command) {
    return to_ && std::fprintf(to_, "%s\n", command.c_str()) > 0 && std::fflush(to_) == 0;
  }

  // The next line of the child's output without its newline; false at end of output.
  bool read_line(std::string* line) {
    char* buf = nullptr;
    size_t cap = 0;
    const ssize_t n = from_ ? getline(&buf, &cap, from_) : -1;
    if (n > 0) line->assign(buf, buf[n - 1] == '\n' ? n - 1 : n);
    std::free(buf);
    return n > 0;
  }

  // send(command), then read_line(answer).
  bool ask(const std::string& command, std::string* answer) {
    return send(command) && read_line(answer);
  }

  // A timed command: once this process and the child are quiet (see wait_until_quiet), asks
  // `command` and appends the "wall:cpu ..." times it answers with to `calls`; false when the
  // child stopped answering.
  bool ask_times(const std::string& command, Calls& calls) {
    if (!wait_until_quiet(pid_)) std::fprintf(stderr, "warning: background threads still busy\n");
    std::string line;
    if (!ask(command, &line)) return false;
    append_peer_times(line, calls);
    return true;
  }

  void stop() {
    if (to_) std::fclose(to_);  // end of input: the script's loop ends
    if (from_) std::fclose(from_);
    to_ = from_ = nullptr;
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

}  // namespace tessel::bench
