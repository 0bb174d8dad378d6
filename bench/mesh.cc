// bench/mesh: the cost for one rank of making a mesh's groups, DeviceMesh (one communicator split
// per dimension) against the one-group-per-sub-group approach (every rank takes part in creating
// every sub-group of every dimension, as torch.distributed.new_group requires), on the fake
// backend (no data moves) for 2-D and 3-D meshes of 8 to 65,536 ranks.
//
//   bench_mesh            worlds 8 .. 65,536
//   bench_mesh --quick    worlds 8 .. 4,096
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"

namespace {

using namespace tessel;

long rss_kib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct Result {
  int64_t creations = 0;
  double seconds = 0;
  long rss_delta_kib = 0;
};

// DeviceMesh with eager groups: one split per dimension.
Result ours(int rank, const std::vector<int64_t>& shape, const std::vector<std::string>& names,
            int64_t world) {
  auto pg = fake::create_process_group(rank, static_cast<int>(world));
  const long before = rss_kib();
  Stopwatch watch;
  DeviceMeshOptions options;
  options.eager = true;
  DeviceMesh mesh = init_device_mesh(pg, shape, names, options);
  Result r;
  r.seconds = watch.elapsed_seconds();
  r.creations = mesh.splits_made();
  r.rss_delta_kib = rss_kib() - before;
  return r;
}

// Baseline: for every dimension, every sub-group is created by a call every rank makes; a rank
// keeps only the groups it belongs to.
Result baseline(int rank, const std::vector<int64_t>& shape, const std::vector<std::string>& names,
                int64_t world) {
  auto pg = fake::create_process_group(rank, static_cast<int>(world));
  const MeshLayout layout = MeshLayout::row_major(shape, names);
  const long before = rss_kib();
  Stopwatch watch;
  std::vector<std::shared_ptr<ProcessGroup>> kept;
  Result r;
  for (const MeshDim& dim : layout.dims()) {
    const auto offsets = dim.offsets();
    const auto mine = MeshLayout::membership(dim, rank);
    // Origins of every sub-group along this dimension, in the same order on every rank.
    for (int64_t origin = 0; origin < world; ++origin) {
      if (MeshLayout::membership(dim, origin).color != origin) continue;
      SplitOptions options;
      const bool member = origin == mine.color;
      if (member) {
        for (int64_t o : offsets) options.members.push_back(static_cast<int>(origin + o));
      }
      auto g = pg->split(member ? 0 : kNoColor, static_cast<int>(mine.key), options);
      if (g) kept.push_back(std::move(g));
      ++r.creations;
    }
  }
  r.seconds = watch.elapsed_seconds();
  r.rss_delta_kib = rss_kib() - before;
  return r;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  fr::FlightRecorder::global().set_enabled(false);  // measure group creation, not recording
  std::vector<int64_t> worlds = {8, 64, 512, 4096};
  if (!quick) {
    worlds.push_back(32768);
    worlds.push_back(65536);
  }
  std::printf("%-7s %-12s | %-26s | %-30s | %s\n", "world", "shape", "DeviceMesh (split/dim)",
              "one group per sub-group", "ratio (baseline/ours)");
  std::printf("%-7s %-12s | %8s %9s %7s | %8s %11s %9s | %8s %8s\n", "", "", "creates", "time",
              "RSS KiB", "creates", "time", "RSS KiB", "creates", "time");
  for (int64_t world : worlds) {
    std::vector<std::pair<std::vector<int64_t>, std::vector<std::string>>> meshes = {
        {{world / 8, 8}, {"dp", "tp"}}};
    if (world >= 64)
      meshes.push_back({{world / 64, 8, 8}, {"dp", "pp", "tp"}});
    else
      meshes.push_back({{2, 2, 2}, {"dp", "pp", "tp"}});
    for (const auto& [shape, names] : meshes) {
      const int rank = static_cast<int>(world / 2 + 1) % static_cast<int>(world);
      const Result a = ours(rank, shape, names, world);
      const Result b = baseline(rank, shape, names, world);
      std::printf(
          "%-7lld %-12s | %8lld %9s %7ld | %8lld %11s %9ld | %7.0fx %7.0fx\n",
          static_cast<long long>(world), shape_text(shape).c_str(),
          static_cast<long long>(a.creations),
          format_duration(std::chrono::nanoseconds(static_cast<int64_t>(a.seconds * 1e9))).c_str(),
          a.rss_delta_kib, static_cast<long long>(b.creations),
          format_duration(std::chrono::nanoseconds(static_cast<int64_t>(b.seconds * 1e9))).c_str(),
          b.rss_delta_kib, static_cast<double>(b.creations) / a.creations, b.seconds / a.seconds);
    }
  }
  std::printf(
      "\nOne rank's cost on the fake backend (no data moves): creations are communicator\n"
      "creations this rank takes part in; on NCCL each is a communicator init.\n");
  return 0;
}
