#include "tessel/launcher/log_mux.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace tessel::launcher {
namespace {

std::vector<std::string> split_all(const std::string& text, size_t chunk, size_t max_line) {
  LineSplitter s(max_line);
  std::vector<std::string> lines;
  auto on = [&](std::string_view l) { lines.emplace_back(l); };
  for (size_t i = 0; i < text.size(); i += chunk) {
    s.feed(std::string_view(text).substr(i, chunk), on);
  }
  s.finish(on);
  return lines;
}

TEST(LineSplitterTest, SameLinesWhateverTheChunking) {
  const std::string text = "alpha\n\nbeta gamma\nlast without newline";
  const std::vector<std::string> expected = {"alpha", "", "beta gamma", "last without newline"};
  for (size_t chunk : {1, 2, 3, 7, 64}) {
    EXPECT_EQ(split_all(text, chunk, 1 << 20), expected) << "chunk " << chunk;
  }
}

TEST(LineSplitterTest, LongLinesComeOutInBoundedPieces) {
  const std::string text = std::string(10, 'a') + "\nbb\n";
  EXPECT_EQ(split_all(text, 3, 4), (std::vector<std::string>{"aaaa", "aaaa", "aa", "bb"}));
}

struct Pipe {
  Pipe() { EXPECT_EQ(pipe2(fd, O_NONBLOCK), 0); }
  ~Pipe() { close(fd[0]), close(fd[1]); }
  std::string drain() {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }
  int fd[2];
};

TEST(LogMuxTest, PrefixesFilterAndKeepsStderrTail) {
  Pipe out, err;
  LogMuxOptions o;
  o.prefix_format = "<{host}/{node}:{rank}.{local_rank} {stream}>";
  o.node_rank = 2;
  o.host = "h";
  o.console_stdout_fd = out.fd[1];
  o.console_stderr_fd = err.fd[1];
  o.console_local_ranks = std::set<int>{1};
  o.stderr_tail_lines = 2;
  LogMux mux(o);
  mux.write_line(0, 8, WorkerStream::kStdout, "hidden by the filter");
  mux.write_line(1, 9, WorkerStream::kStdout, "shown");
  for (const char* l : {"e1", "e2", "e3"}) mux.write_line(1, 9, WorkerStream::kStderr, l);
  EXPECT_EQ(out.drain(), "<h/2:9.1 out> shown\n");
  EXPECT_EQ(err.drain(), "<h/2:9.1 err> e1\n<h/2:9.1 err> e2\n<h/2:9.1 err> e3\n");
  EXPECT_EQ(mux.stderr_tail(1), "e2\ne3");
}

// --redirects 0:1,1:2: rank 0's stdout and rank 1's stderr stay off the console.
TEST(LogMuxTest, RedirectsPerLocalRank) {
  Pipe out, err;
  LogMuxOptions o;
  o.prefix_format = "[{local_rank}]";
  o.console_stdout_fd = out.fd[1];
  o.console_stderr_fd = err.fd[1];
  o.redirects.per_rank = {{0, 1}, {1, 2}};
  LogMux mux(o);
  mux.write_line(0, 0, WorkerStream::kStdout, "a");
  mux.write_line(0, 0, WorkerStream::kStderr, "b");
  mux.write_line(1, 1, WorkerStream::kStdout, "c");
  mux.write_line(1, 1, WorkerStream::kStderr, "d");
  mux.write_line(2, 2, WorkerStream::kStdout, "e");
  EXPECT_EQ(out.drain(), "[1] c\n[2] e\n");
  EXPECT_EQ(err.drain(), "[0] b\n");
}

}  // namespace
}  // namespace tessel::launcher
