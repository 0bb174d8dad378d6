// bench_dtensor: DTensor::redistribute against the raw ProcessGroup collective it runs, on the
// same buffers in the same run (Gloo, forked processes over loopback), and PyTorch's
// DTensor.redistribute against its raw torch.distributed call, measured in the same run.
//
//   bench_dtensor --np 2                                  # ours only
//   bench_dtensor --np 2 --torch auto                     # + PyTorch (venv from
//   scripts/torch-venv.sh) bench_dtensor --np 2 --torch /tmp/torch-venv/bin/python --sizes
//   64,262144,1048576,4194304 bench_dtensor --np 3 --transitions S0-\>S1,S1-\>S0 --rounds 15
//   bench_dtensor --np 2 --noise-floor                    # the raw call against itself
//
// Table 1 (per transition and size): time per call of redistribute and of the raw collective,
// their ratio (raw / ours; target >= 0.95 from 1 MiB up) and the time redistribute adds; then
// rank 0's process CPU time per call (all threads, user + system; medians) of both and their
// ratio: with as many busy threads as cores, a time ratio that follows the CPU ratio is work
// done (a copy the raw call does not make), not waiting. The raw call is the collective the
// redistribution runs, on contiguous tensors of the same bytes, into an output allocated per
// call as redistribute's result is (and as the PyTorch peer's raw calls do). For Shard->Shard,
// whose pieces are strided column blocks, a second pair times redistribute against the
// all_to_all of those very views: the collective it runs, so that ratio isolates what
// redistribute adds from what the strided layout costs the transport.
// Table 2: host overhead per call — what a call adds to the raw collective at the smallest size,
// ours and PyTorch's, side by side (target: ours at least 10x less); and ours with no transport
// at all (the fake backend), the framework's own cost.

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_host.h"
#include "bench_pair.h"
#include "bench_processes.h"
#include "tessel/base/clock.h"
#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/ops.h"

namespace {

using namespace tessel;

struct Flags {
  int np = 2;
  std::string sizes = "64,262144,1048576,4194304,16777216";  // f32 elements of the global tensor
  int rounds = 7;
  std::string torch;         // a python with torch, "auto", or empty
  std::string transitions;   // names to run, comma-separated; empty: all
  bool noise_floor = false;  // time the raw call against itself
};

struct Row {
  std::string transition;
  int64_t bytes = 0;
  double ours = 0, raw = 0;  // seconds per call
  double median_ratio = 0;
  double ours_cpu = 0, raw_cpu = 0;  // rank 0's process CPU seconds per call
  // Shard->Shard only (0 otherwise): a second pair against the all_to_all of the very views
  // redistribute passes (strided column blocks), best seconds and ratios.
  double views_ours = 0, views = 0, views_median = 0;
};

// One transition on a 1-D mesh of the world: the DTensor to start from, its target, and the raw
// collective the redistribution runs (on tensors of the same shapes).
struct Transition {
  std::string name;
  std::vector<Placement> from, to;
};

const std::vector<Transition> kTransitions = {
    {"S0->R", {Shard{0}}, {Replicate{}}},  // all_gather
    {"P->R", {Partial{}}, {Replicate{}}},  // all_reduce
    {"P->S0", {Partial{}}, {Shard{0}}},    // reduce_scatter
    {"S0->S1", {Shard{0}}, {Shard{1}}},    // all_to_all, strided on the way out
    {"S1->S0", {Shard{1}}, {Shard{0}}},    // all_to_all, strided on the way in
    {"R->S0", {Replicate{}}, {Shard{0}}},  // a local slice
};

// The global shape of about `numel` f32 elements for a world of `np`: rows a multiple of np^2.
Shape global_shape(int64_t numel, int np) {
  const int64_t n = np, n2 = n * n;
  const int64_t near = n2 * std::max<int64_t>(1, numel / (64 * n2));  // about 64 columns
  // Columns a multiple of np too, so Shard(1) splits evenly (the raw all_to_all is even), and
  // rows rounded up so the tensor holds at least `numel` elements.
  const int64_t cols = n * ((std::max<int64_t>(1, numel / near) + n - 1) / n);
  return {n2 * ((numel + cols * n2 - 1) / (cols * n2)), cols};
}

std::function<void()> raw_call(ProcessGroup& pg, const Transition& t, const DTensor& x) {
  const Shape g = x.global_shape();
  const Tensor local = x.to_local();
  if (t.name == "S0->R") {
    return [&pg, local, g] {
      Tensor out = empty(g);
      pg.all_gather(local, out);
    };
  }
  if (t.name == "P->R") {
    return [&pg, local] {
      Tensor copy = clone(local);  // redistribute never reduces into its input either
      pg.all_reduce(copy);
    };
  }
  if (t.name == "P->S0") {
    return [&pg, local, g] {
      Tensor out = empty({g[0] / pg.size(), g[1]});
      pg.reduce_scatter(local, out);
    };
  }
  if (t.name == "S0->S1" || t.name == "S1->S0") {
    return [&pg, local] {
      Tensor out = empty(local.shape());
      pg.all_to_all(local, out);
    };
  }
  const int r = pg.rank(), n = pg.size();  // R->S0: the slice, made contiguous
  return [local, r, n] {
    (void)contiguous(narrow(local, 0, r * local.size(0) / n, local.size(0) / n));
  };
}

// Shard->Shard's own collective: the all_to_all of the column blocks of the local tensor into
// the row blocks of a result allocated per call (or the reverse), the views redistribute makes.
std::function<void()> views_call(ProcessGroup& pg, const Transition& t, const DTensor& x) {
  const Tensor local = x.to_local();
  const int64_t gather = t.name == "S0->S1" ? 0 : 1, split = 1 - gather;
  return [&pg, local, gather, split] {
    const int64_t n = pg.size();
    Shape shape = local.shape();
    shape[static_cast<size_t>(gather)] *= n;
    shape[static_cast<size_t>(split)] /= n;
    Tensor out = empty(shape);
    std::vector<Tensor> inputs, outputs;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t piece = shape[static_cast<size_t>(split)], got = local.size(gather);
      inputs.push_back(narrow(local, split, r * piece, piece));
      outputs.push_back(narrow(out, gather, r * got, got));
    }
    pg.all_to_all(std::move(inputs), std::move(outputs));
  };
}

bool wanted(const Flags& flags, const Transition& t) {
  return flags.transitions.empty() ||
         ("," + flags.transitions + ",").find("," + t.name + ",") != std::string::npos;
}

std::vector<Row> run_rank(ProcessGroup& pg, const Flags& flags) {
  const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {pg.size()}, {"dp"});
  std::vector<Row> rows;
  std::stringstream sizes(flags.sizes);
  for (std::string item; std::getline(sizes, item, ',');) {
    const Shape shape = global_shape(std::stoll(item), pg.size());
    const Tensor full = randn(shape);
    for (const Transition& t : kTransitions) {
      if (!wanted(flags, t)) continue;
      const DTensor x = distribute_tensor(full, mesh, t.from);
      const auto raw = raw_call(pg, t, x);
      std::function<void()> ours = [&] { (void)x.redistribute(t.to); };
      if (flags.noise_floor) ours = raw_call(pg, t, x);
      auto barrier = [&] { pg.barrier(); };
      const int iters = bench::calls_per_round(pg, raw, barrier);
      const bench::PairTiming p = bench::time_pair(ours, raw, barrier, iters, flags.rounds);
      rows.push_back(
          {t.name, shape_numel(shape) * 4, p.ours, p.peer, p.median_ratio, p.ours_cpu, p.peer_cpu});
      if (t.name == "S0->S1" || t.name == "S1->S0") {
        const auto views = views_call(pg, t, x);
        if (flags.noise_floor) ours = views_call(pg, t, x);
        const bench::PairTiming v = bench::time_pair(ours, views, barrier, iters, flags.rounds);
        rows.back().views_ours = v.ours;
        rows.back().views = v.peer;
        rows.back().views_median = v.median_ratio;
      }
    }
  }
  return rows;
}

// Framework cost of a redistribution with no transport: the fake backend moves no data.
double fake_overhead_seconds(const Transition& t) {
  auto pg = fake::create_process_group(0, 2);
  const DeviceMesh mesh = init_device_mesh(pg, {2}, {"dp"});
  const DTensor x = distribute_tensor(zeros({8, 8}), mesh, t.from);
  for (int i = 0; i < 200; ++i) (void)x.redistribute(t.to);
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const Stopwatch watch;
    for (int i = 0; i < 2000; ++i) (void)x.redistribute(t.to);
    best = std::min(best, watch.elapsed_seconds() / 2000);
  }
  return best;
}

// Runs the ranks as forked processes; rank 0 writes its rows to `out`.
bool run_ours(const Flags& flags, const std::string& out) {
  const std::string dir =
      std::filesystem::temp_directory_path() / fmt::format("tessel-bench-dtensor-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const bool ok = bench::fork_ranks(flags.np, [&](int rank) {
    auto store = std::make_shared<FileStore>(dir, std::chrono::seconds(60));
    auto pg = gloo::create_process_group(store, rank, flags.np, {.hostname = "127.0.0.1"});
    const std::vector<Row> rows = run_rank(*pg, flags);
    if (rank == 0) {
      std::ofstream f(out);
      for (const Row& r : rows) {
        f << r.transition << " " << r.bytes << " " << r.ours << " " << r.raw << " "
          << r.median_ratio << " " << r.ours_cpu << " " << r.raw_cpu << " " << r.views_ours << " "
          << r.views << " " << r.views_median << "\n";
      }
    }
  });
  std::filesystem::remove_all(dir);
  return ok;
}

// PyTorch's figures: transition -> bytes -> (dtensor seconds, raw seconds), or an error text.
struct TorchRows {
  std::string version;
  std::map<std::string, std::map<int64_t, std::pair<double, double>>> times;
  std::map<std::string, std::string> errors;
};

bool run_torch(const Flags& flags, const std::string& python, TorchRows* rows, std::string* why) {
  const std::string script =
      std::string(TESSEL_SOURCE_DIR) + "/bench/dtensor/torch_redistribute.py";
  const std::string cmd = fmt::format(
      "PYTHONWARNINGS=ignore TORCH_CPP_LOG_LEVEL=ERROR '{}' '{}' --np {} "
      "--sizes {} --rounds {} 2>/dev/null",
      python, script, flags.np, flags.sizes, flags.rounds);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "could not start " + python;
    return false;
  }
  char line[4096];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    const std::string s(line);
    if (s.rfind("torch ", 0) == 0) {
      rows->version = s.substr(6, s.size() - 7);
      continue;
    }
    auto field = [&](const std::string& key) {
      const size_t at = s.find("\"" + key + "\": ");
      if (at == std::string::npos) return std::string();
      size_t begin = at + key.size() + 4;
      size_t end = s.find_first_of(",}", begin);
      std::string v = s.substr(begin, end - begin);
      if (!v.empty() && v[0] == '"') v = s.substr(begin + 1, s.find('"', begin + 1) - begin - 1);
      return v;
    };
    const std::string name = field("transition");
    if (name.empty()) continue;
    const std::string error = field("error");
    if (!error.empty()) {
      rows->errors[name] = error;
      continue;
    }
    rows->times[name][std::stoll(field("bytes"))] = {std::stod(field("dtensor_s")),
                                                     std::stod(field("raw_s"))};
  }
  const int status = ::pclose(p);
  if (status != 0 || rows->times.empty()) {
    *why = python + " did not produce results (is torch installed there?)";
    return false;
  }
  return true;
}

std::string size_text(int64_t bytes) {
  if (bytes >= (1 << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1 << 10)) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app("DTensor redistribute vs the raw collective, and vs PyTorch DTensor");
  app.add_option("--np", flags.np, "processes (Gloo over loopback)")->check(CLI::Range(2, 16));
  app.add_option("--sizes", flags.sizes, "global tensor sizes in f32 elements, comma-separated");
  app.add_option("--rounds", flags.rounds, "alternating timing rounds");
  app.add_option("--torch", flags.torch, "python with torch, or 'auto' (scripts/torch-venv.sh)");
  app.add_option("--transitions", flags.transitions,
                 "transitions to time, comma-separated (S0->R,P->R,P->S0,S0->S1,S1->S0,R->S0)");
  app.add_flag("--noise-floor", flags.noise_floor,
               "time the raw call against itself (in the 'ours' columns): the ratios this prints "
               "are the machine's run-to-run spread, against which ours are read");
  CLI11_PARSE(app, argc, argv);
  if (!gloo::is_available()) {
    std::printf("skipped: this build has no Gloo backend\n");
    return 0;
  }
  if (flags.noise_floor) std::printf("noise floor: 'ours' is the raw call timed against itself\n");
  std::printf("bench_dtensor: %d processes over Gloo (loopback), load %s\ncpu: %s\n\n", flags.np,
              bench::load_average().c_str(), bench::cpu_features({"avx512f", "amx_tile"}).c_str());

  const std::string out = std::filesystem::temp_directory_path() /
                          fmt::format("tessel-bench-dtensor-{}.txt", ::getpid());
  if (!run_ours(flags, out)) {
    std::fprintf(stderr, "bench_dtensor: a rank failed\n");
    return 1;
  }
  std::vector<Row> rows;
  {
    std::ifstream f(out);
    Row r;
    while (f >> r.transition >> r.bytes >> r.ours >> r.raw >> r.median_ratio >> r.ours_cpu >>
           r.raw_cpu >> r.views_ours >> r.views >> r.views_median) {
      rows.push_back(r);
    }
  }
  std::filesystem::remove(out);

  TorchRows torch;
  bool with_torch = false;
  std::string why = "not asked for (--torch PYTHON or --torch auto)";
  const std::string python = bench::torch_python(flags.torch, TESSEL_SOURCE_DIR);
  if (python.empty() && flags.torch == "auto") why = "scripts/torch-venv.sh failed";
  if (!python.empty()) with_torch = run_torch(flags, python, &torch, &why);
  std::printf("torch: %s\n\n",
              with_torch ? ("PyTorch " + torch.version).c_str() : ("skipped: " + why).c_str());

  std::printf("%-8s %9s | %10s %10s %7s %7s %9s | %9s %9s %7s", "transition", "size", "ours us",
              "raw us", "raw/ours", "median", "added us", "ours cpu", "raw cpu", "cpu r/o");
  if (with_torch) std::printf(" | %11s %9s %9s", "torch us", "raw us", "added us");
  std::printf("\n");
  double lowest = 1e30;
  std::string lowest_at;
  for (const Row& r : rows) {
    std::printf("%-10s %9s | %10.1f %10.1f %8.3f %7.3f %9.1f | %9.1f %9.1f %7.3f",
                r.transition.c_str(), size_text(r.bytes).c_str(), r.ours * 1e6, r.raw * 1e6,
                r.raw / r.ours, r.median_ratio, (r.ours - r.raw) * 1e6, r.ours_cpu * 1e6,
                r.raw_cpu * 1e6, r.raw_cpu / r.ours_cpu);
    if (with_torch) {
      const auto it = torch.times[r.transition].find(r.bytes);
      if (it != torch.times[r.transition].end()) {
        std::printf(" | %11.1f %9.1f %9.1f", it->second.first * 1e6, it->second.second * 1e6,
                    (it->second.first - it->second.second) * 1e6);
      } else if (torch.errors.count(r.transition)) {
        std::printf(" | %s", torch.errors[r.transition].c_str());
      }
    }
    std::printf("\n");
    if (r.bytes >= (1 << 20) && r.transition != "R->S0" && r.raw / r.ours < lowest) {
      lowest = r.raw / r.ours;
      lowest_at = r.transition + " " + size_text(r.bytes);
    }
  }
  if (lowest < 1e30) {
    std::printf("\nfrom 1 MiB up: lowest raw/ours %.3f (%s); target >= 0.95\n", lowest,
                lowest_at.c_str());
  }

  // Shard->Shard against the collective it runs on the same views: what redistribute adds,
  // apart from the cost of the strided layout that the contiguous raw call above does not pay.
  bool any_views = false;
  double lowest_views = 1e30;
  std::string lowest_views_at;
  for (const Row& r : rows) {
    if (r.views <= 0) continue;
    if (!any_views) {
      std::printf("\nShard->Shard against the all_to_all of the same (strided) views:\n");
      std::printf("%-8s %9s | %10s %10s %8s %7s %9s\n", "transition", "size", "ours us", "views us",
                  "views/ours", "median", "added us");
      any_views = true;
    }
    std::printf("%-10s %9s | %10.1f %10.1f %10.3f %7.3f %9.1f\n", r.transition.c_str(),
                size_text(r.bytes).c_str(), r.views_ours * 1e6, r.views * 1e6,
                r.views / r.views_ours, r.views_median, (r.views_ours - r.views) * 1e6);
    if (r.bytes >= (1 << 20) && r.views / r.views_ours < lowest_views) {
      lowest_views = r.views / r.views_ours;
      lowest_views_at = r.transition + " " + size_text(r.bytes);
    }
  }
  if (lowest_views < 1e30) {
    std::printf("from 1 MiB up: lowest views/ours %.3f (%s)\n", lowest_views,
                lowest_views_at.c_str());
  }

  std::printf("\nhost overhead per call at the smallest size (added to the raw call), us:\n");
  std::printf("%-10s %10s %12s", "transition", "ours", "ours (fake)");
  if (with_torch) std::printf(" %10s %12s", "torch", "torch/ours");
  std::printf("\n");
  const int64_t smallest = rows.empty() ? 0 : rows.front().bytes;
  for (const Transition& t : kTransitions) {
    if (!wanted(flags, t)) continue;
    for (const Row& r : rows) {
      if (r.transition != t.name || r.bytes != smallest) continue;
      const double ours_added = std::max(r.ours - r.raw, 0.0);
      const double fake = fake_overhead_seconds(t);
      std::printf("%-10s %10.1f %12.1f", t.name.c_str(), ours_added * 1e6, fake * 1e6);
      if (with_torch) {
        const auto it = torch.times[t.name].find(r.bytes);
        if (it != torch.times[t.name].end()) {
          const double torch_added = it->second.first - it->second.second;
          std::printf(" %10.1f %12.1f", torch_added * 1e6,
                      torch_added / std::max(ours_added, fake));
        }
      }
      std::printf("\n");
    }
  }
  std::printf("(torch/ours divides by the larger of our two overhead figures)\n");
  return 0;
}
