#pragma once
// Ranks as forked processes, and the Python that runs the PyTorch peers: shared by the benches
// that run real processes over Gloo and compare with PyTorch.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace tessel::bench {

// Forks `np` children running fn(rank); a child exits 0 when fn returns and 1 (printing the
// error) when it throws. Waits for all; true when every one exited 0. Call before this process
// starts threads (fork copies only the caller).
inline bool fork_ranks(int np, const std::function<void(int rank)>& fn) {
  std::vector<pid_t> children;
  for (int rank = 0; rank < np; ++rank) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        fn(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 1;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// The Python for the PyTorch peers: `flag` itself, or for "auto" the venv's python that
// scripts/torch-venv.sh (under `source_dir`) makes or finds; empty when it fails.
inline std::string torch_python(const std::string& flag, const std::string& source_dir) {
  if (flag != "auto") return flag;
  FILE* p = ::popen((source_dir + "/scripts/torch-venv.sh").c_str(), "r");
  char buf[1024] = {};
  std::string python = p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr ? buf : "";
  if (p != nullptr) ::pclose(p);
  while (!python.empty() && python.back() == '\n') python.pop_back();
  return python;
}

}  // namespace tessel::bench
