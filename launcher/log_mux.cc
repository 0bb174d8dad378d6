#include "tessel/launcher/log_mux.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "tessel/base/error.h"

namespace tessel::launcher {

void LineSplitter::feed(std::string_view bytes,
                        const std::function<void(std::string_view)>& on_line) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const size_t take = nl == std::string_view::npos ? bytes.size() : nl;
    if (pending_.empty() && nl != std::string_view::npos && take <= max_line_) {
      on_line(bytes.substr(0, take));  // the common case: no copy
    } else {
      pending_.append(bytes.substr(0, take));
      while (pending_.size() > max_line_) {
        on_line(std::string_view(pending_).substr(0, max_line_));
        pending_.erase(0, max_line_);
      }
      if (nl != std::string_view::npos) {
        on_line(pending_);
        pending_.clear();
      }
    }
    bytes.remove_prefix(nl == std::string_view::npos ? bytes.size() : nl + 1);
  }
}

void LineSplitter::finish(const std::function<void(std::string_view)>& on_line) {
  if (!pending_.empty()) on_line(pending_);
  pending_.clear();
}

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

LogMux::LogMux(LogMuxOptions options) : options_(std::move(options)) {}

LogMux::~LogMux() { close_files(); }

void LogMux::close_files() {
  for (auto& f : files_) {
    if (f.out >= 0) ::close(f.out);
    if (f.err >= 0) ::close(f.err);
  }
  files_.clear();
}

void LogMux::begin_attempt(const std::string& attempt_dir, int node_rank,
                           const std::vector<int>& global_ranks) {
  close_files();
  options_.node_rank = node_rank;
  files_.resize(global_ranks.size());
  tails_.assign(global_ranks.size(), {});
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    for (auto [fd, ext] :
         {std::pair{&files_[i].out, "stdout"}, std::pair{&files_[i].err, "stderr"}}) {
      const std::string path = fmt::format("{}/rank_{}.{}.log", attempt_dir, global_ranks[i], ext);
      *fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
      if (*fd < 0) throw_system_error("open log file " + path, errno);
    }
  }
}

std::string LogMux::prefix(int local_rank, int global_rank, WorkerStream stream) const {
  std::string out;
  const std::string_view f = options_.prefix_format;
  for (size_t i = 0; i < f.size();) {
    const auto token = [&](std::string_view t) { return f.substr(i, t.size()) == t; };
    if (token("{node}")) {
      out += std::to_string(options_.node_rank), i += 6;
    } else if (token("{rank}")) {
      out += std::to_string(global_rank), i += 6;
    } else if (token("{local_rank}")) {
      out += std::to_string(local_rank), i += 12;
    } else if (token("{host}")) {
      out += options_.host, i += 6;
    } else if (token("{role}")) {
      out += options_.role, i += 6;
    } else if (token("{stream}")) {
      out += stream == WorkerStream::kStdout ? "out" : "err", i += 8;
    } else {
      out += f[i++];
    }
  }
  if (!out.empty()) out += ' ';
  return out;
}

void LogMux::write_line(int local_rank, int global_rank, WorkerStream stream,
                        std::string_view line) {
  const auto lr = static_cast<size_t>(local_rank);
  std::string text = prefix(local_rank, global_rank, stream);
  text.append(line);
  text.push_back('\n');
  if (lr < files_.size()) {
    write_all(stream == WorkerStream::kStdout ? files_[lr].out : files_[lr].err,
              std::string_view(text).substr(text.size() - line.size() - 1));
  }
  if (stream == WorkerStream::kStderr) {
    if (lr >= tails_.size()) tails_.resize(lr + 1);
    tails_[lr].emplace_back(line);
    if (tails_[lr].size() > options_.stderr_tail_lines) tails_[lr].pop_front();
  }
  const bool shown =
      !options_.console_local_ranks || options_.console_local_ranks->count(local_rank) != 0;
  if (!shown) return;
  if (options_.redirects.selects(local_rank, stream)) return;
  write_all(
      stream == WorkerStream::kStdout ? options_.console_stdout_fd : options_.console_stderr_fd,
      text);
}

std::string LogMux::stderr_tail(int local_rank) const {
  std::string out;
  if (static_cast<size_t>(local_rank) >= tails_.size()) return out;
  for (const auto& l : tails_[static_cast<size_t>(local_rank)]) {
    if (!out.empty()) out += '\n';
    out += l;
  }
  return out;
}

}  // namespace tessel::launcher
