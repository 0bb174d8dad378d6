#pragma once
// Worker output, line by line: LineSplitter turns a pipe's byte stream into whole lines, and
// LogMux writes each line, prefixed ("[node:rank] "), with one write(2) to the console and to
// the attempt's per-rank log file, so lines from different workers never interleave or split.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::launcher {

// Accumulates bytes and hands out complete lines (without the '\n'). A line longer than
// max_line is handed out in max_line pieces rather than buffered without bound. Not
// thread-safe; one per stream.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 1 << 20) : max_line_(max_line) {}
  // Calls on_line for every line completed by `bytes`.
  void feed(std::string_view bytes, const std::function<void(std::string_view)>& on_line);
  // At end of stream: the unterminated rest, if any, as a last line.
  void finish(const std::function<void(std::string_view)>& on_line);

 private:
  size_t max_line_;
  std::string pending_;
};

enum class WorkerStream : uint8_t { kStdout, kStderr };

// Which worker streams a --redirects/--tee value selects: torchrun's 0 (none), 1 (stdout),
// 2 (stderr), 3 (both), for every local rank or per local rank ("0:1,1:2").
struct StreamSelection {
  int all = 0;                  // for local ranks not listed
  std::map<int, int> per_rank;  // local rank -> 0..3
  bool selects(int local_rank, WorkerStream stream) const {
    const auto it = per_rank.find(local_rank);
    const int v = it == per_rank.end() ? all : it->second;
    return (v & (stream == WorkerStream::kStdout ? 1 : 2)) != 0;
  }
};

struct LogMuxOptions {
  // {node} {rank} {local_rank} {host} {role} {stream}
  std::string prefix_format = "[{node}:{rank}]";
  int node_rank = 0;
  std::string host;
  std::string role = "default";
  StreamSelection redirects;  // streams kept in files only, off the console (--redirects)
  std::optional<std::set<int>> console_local_ranks;  // --local-ranks-filter
  int console_stdout_fd = 1;
  int console_stderr_fd = 2;
  size_t stderr_tail_lines = 20;  // kept per worker for failure reports
};

// Routes worker lines to the console and to <attempt_dir>/rank_<R>.{stdout,stderr}.log.
// Not thread-safe: used by the agent's event loop only. Owns the log files it opens.
class LogMux {
 public:
  explicit LogMux(LogMuxOptions options);
  ~LogMux();
  LogMux(const LogMux&) = delete;
  LogMux& operator=(const LogMux&) = delete;

  // Opens the per-rank files of a new attempt (closing the previous attempt's); `node_rank` is
  // this node's group rank in the attempt ({node}). Throws IoError.
  void begin_attempt(const std::string& attempt_dir, int node_rank,
                     const std::vector<int>& global_ranks);
  // Writes one whole line of a worker.
  void write_line(int local_rank, int global_rank, WorkerStream stream, std::string_view line);
  // The last lines the worker wrote to stderr in this attempt, joined with '\n'.
  std::string stderr_tail(int local_rank) const;
  // The prefix for a worker, e.g. "[0:3] ".
  std::string prefix(int local_rank, int global_rank, WorkerStream stream) const;

 private:
  struct Files {
    int out = -1;
    int err = -1;
  };
  void close_files();

  LogMuxOptions options_;
  std::vector<Files> files_;                    // by local rank
  std::vector<std::deque<std::string>> tails_;  // by local rank
};

// Writes all of `data` to fd (retrying short writes and EINTR). Best effort: errors dropped.
void write_all(int fd, std::string_view data);

}  // namespace tessel::launcher
