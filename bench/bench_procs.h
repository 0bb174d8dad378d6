#pragma once
// Helpers of the training benchmarks that fork Gloo ranks and run a PyTorch peer script in the
// same run: forked processes over a FileStore (bench_processes.h), the medians they report
// (bench_host.h's median), and the peer's "torch <setup> <tokens/s> <seconds>" lines.

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_host.h"  // median
#include "bench_processes.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/store/file_store.h"

namespace tessel::bench {

// Runs fn(rank, world group) in `np` forked processes joined over Gloo on loopback; returns the
// value rank 0's fn returned (seconds per step, say), or 0 when any process failed (its error
// printed).
inline double run_forked(int np, const std::string& tag,
                         const std::function<double(int, std::shared_ptr<ProcessGroup>)>& fn) {
  const std::string dir =
      std::filesystem::temp_directory_path() / fmt::format("tessel-bench-{}-{}", ::getpid(), tag);
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/result";
  const bool ok = fork_ranks(np, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir + "/store", std::chrono::seconds(60));
    auto pg = gloo::create_process_group(store, rank, np, {.hostname = "127.0.0.1"});
    const double value = fn(rank, pg);
    if (rank == 0) std::ofstream(out) << value;
  });
  double value = 0;
  std::ifstream(out) >> value;
  std::filesystem::remove_all(dir);
  return ok ? value : 0;
}

// Runs a peer command printing "torch <version>" then "torch <setup> <tokens/s> <seconds>" lines:
// seconds per setup, and the version in *version.
inline std::map<std::string, double> run_peer(const std::string& cmd, std::string* version) {
  std::map<std::string, double> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    char setup[64];
    double tps = 0, seconds = 0;
    if (std::sscanf(line, "torch %63s %lf %lf", setup, &tps, &seconds) == 3) {
      out[setup] = seconds;
    } else if (std::string(line).rfind("torch ", 0) == 0) {
      *version = std::string(line + 6);
      while (!version->empty() && version->back() == '\n') version->pop_back();
    }
  }
  ::pclose(p);
  return out;
}

}  // namespace tessel::bench
