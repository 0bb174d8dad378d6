// bench_checkpoint: distributed checkpoint save and load throughput beside the disk's own
// sequential write and read (dd with fdatasync) and beside torch.distributed.checkpoint saving and
// loading the same state on CPU over Gloo, in the same run; then the training-step stall of an
// async save.
//
//   bench_checkpoint                                  # 2 processes, 512 MiB of state
//   bench_checkpoint --np 4 --mib 1024 --torch auto   # + PyTorch DCP (scripts/torch-venv.sh)
//
// The state is --tensors f32 tensors of --mib MiB in all, each sharded on dim 0 over --np
// processes (Gloo over loopback, FileStore rendezvous). Save time runs from a barrier to the
// commit on every rank (files fsync'ed, as dd's fdatasync and DCP's sync_files). Before each
// load, and before dd's read, the files are evicted from the page cache (posix_fadvise
// DONTNEED), so reads come from the disk, not memory. Rounds alternate dd, ours and PyTorch's;
// medians are printed.

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_host.h"
#include "bench_processes.h"
#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

namespace fs = std::filesystem;
using namespace tessel;

struct Flags {
  int np = 2;
  int64_t mib = 512;
  int64_t tensors = 8;
  int rounds = 3;
  std::string dir = fs::temp_directory_path().string();
  std::string torch;
  bool stall = true;
};

int64_t rows_of(const Flags& f, int64_t cols) { return f.mib * 1048576 / 4 / f.tensors / cols; }
constexpr int64_t kCols = 4096;

// Drops every file under `dir` from the page cache (they are clean: written and fsync'ed).
void evict(const std::string& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `cmd` and returns its output (stdout and stderr).
std::string capture(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  ::pclose(p);
  return out;
}

// Seconds of dd's sequential write (fdatasync) and cold read of `bytes`, parsed from its
// summary line ("..., 0.323 s, 1.7 GB/s").
std::pair<double, double> run_dd(const Flags& f, int64_t bytes) {
  const std::string file = f.dir + fmt::format("/bench-ckpt-dd-{}.bin", ::getpid());
  auto seconds = [](const std::string& out) {
    const size_t at = out.rfind(" s, ");
    const size_t from = out.rfind(", ", at - 1);
    return at == std::string::npos || from == std::string::npos
               ? 0.0
               : std::stod(out.substr(from + 2, at - from - 2));
  };
  const double write = seconds(capture(
      fmt::format("dd if=/dev/zero of='{}' bs=1M count={} conv=fdatasync", file, bytes / 1048576)));
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const double read = seconds(capture(fmt::format("dd if='{}' of=/dev/null bs=1M", file)));
  fs::remove(file);
  return {write, read};
}

// Ours over np forked processes: {save seconds, load seconds} measured on rank 0.
std::pair<double, double> run_ours(const Flags& f) {
  const std::string dir = f.dir + fmt::format("/bench-ckpt-{}", ::getpid());
  fs::create_directories(dir);
  const std::string result = dir + "/result";
  const bool ok = bench::fork_ranks(f.np, [&](int rank) {
    set_num_threads(1);
    auto store = std::make_shared<FileStore>(dir + "/store", std::chrono::seconds(120));
    auto world = gloo::create_process_group(store, rank, f.np, {.hostname = "127.0.0.1"});
    const DeviceMesh mesh = init_device_mesh(world, {f.np}, {"dp"});
    checkpoint::CheckpointState state(world);
    std::vector<DTensor> tensors;
    for (int64_t i = 0; i < f.tensors; ++i) {
      tensors.push_back(distribute_tensor(full({rows_of(f, kCols), kCols}, static_cast<double>(i)),
                                          mesh, {Shard{0}}));
      state.add_tensor(fmt::format("t{}", i), tensors.back());
    }
    world->barrier();
    const Stopwatch save_watch;
    checkpoint::save(state, dir + "/ckpt");
    const double save_s = save_watch.elapsed_seconds();
    if (rank == 0) evict(dir + "/ckpt");
    for (const DTensor& t : tensors) zero_(t.to_local());
    world->barrier();
    const Stopwatch load_watch;
    checkpoint::load(state, dir + "/ckpt");
    world->barrier();
    const double load_s = load_watch.elapsed_seconds();
    for (int64_t i = 0; i < f.tensors; ++i) {
      TESSEL_CHECK(item(max(tensors[i].to_local())) == static_cast<double>(i), Internal,
                   "tensor {} did not load back", i);
    }
    if (rank == 0) std::ofstream(result) << save_s << " " << load_s;
  });
  double save_s = 0, load_s = 0;
  std::ifstream(result) >> save_s >> load_s;
  fs::remove_all(dir);
  return ok ? std::pair{save_s, load_s} : std::pair{0.0, 0.0};
}

// PyTorch DCP's {save, load} seconds from bench/checkpoint/torch_dcp.py; {0, 0} on failure.
std::pair<double, double> run_torch(const Flags& f, const std::string& python,
                                    std::string* version) {
  const std::string out = capture(fmt::format(
      "PYTHONWARNINGS=ignore '{}' '{}/bench/checkpoint/torch_dcp.py' --np {} --tensors {} "
      "--rows {} --cols {} --dir '{}'",
      python, TESSEL_SOURCE_DIR, f.np, f.tensors, rows_of(f, kCols), kCols, f.dir));
  double save_s = 0, load_s = 0;
  long long bytes = 0;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("torch ", 0) == 0) *version = line.substr(6);
    std::sscanf(line.c_str(), "dcp %lf %lf %lld", &save_s, &load_s, &bytes);
  }
  if (save_s == 0) std::fprintf(stderr, "torch_dcp.py failed:\n%s\n", out.c_str());
  return {save_s, load_s};
}

// The training-step stall of an async save: GPT training in this process with and without
// checkpoints in the background.
void measure_stall(const Flags& f) {
  set_num_threads(f.np);
  const nn::GptConfig config{
      .vocab_size = 256, .block_size = 128, .n_layer = 4, .n_head = 4, .n_embd = 256, .seed = 1};
  nn::GPT model(config);
  nn::optim::AdamW opt(model.parameters(), {.lr = 3e-4});
  checkpoint::CheckpointState state;
  state.add_tensors("model", model.state_dict());
  state.add_optimizer("optim", opt, model);
  int64_t state_bytes = 0;
  for (const auto& t : state.tensors()) state_bytes += static_cast<int64_t>(t.local.nbytes());
  const std::string root = f.dir + fmt::format("/bench-ckpt-stall-{}", ::getpid());
  checkpoint::Checkpointer ckpt(nullptr, root, {.keep_last = 2});
  Generator gen(1);
  auto step = [&] {
    const Tensor tokens = to(mul(rand({8, config.block_size + 1}, gen), 255.0), DType::kI64);
    backward(nn::GPT::loss(model(narrow(tokens, 1, 0, config.block_size)),
                           narrow(tokens, 1, 1, config.block_size)));
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up
  std::vector<double> plain, overlapped, calls;
  for (int i = 0; i < 8; ++i) {
    const Stopwatch w;
    step();
    plain.push_back(w.elapsed_seconds());
  }
  for (int i = 0; i < 8; ++i) {
    // A save every other step: the call (snapshot) stalls; the step after it overlaps the write.
    if (i % 2 == 0) {
      state.step = i;
      const Stopwatch call;
      ckpt.async_save(state);
      calls.push_back(call.elapsed_seconds());
    }
    const Stopwatch w;
    step();
    if (i % 2 == 0) overlapped.push_back(w.elapsed_seconds());
  }
  ckpt.wait();
  state.step = 100;
  const Stopwatch sync;
  ckpt.save(state);
  const double sync_s = sync.elapsed_seconds();
  fs::remove_all(root);
  std::printf(
      "\nasync save stall: GPT %lld layers x %lld wide, %.1f MiB of state (params + AdamW), %d "
      "threads\n"
      "  training step                       %8.1f ms (median, no save)\n"
      "  async_save() call (host snapshot)   %8.1f ms (median of %zu)\n"
      "  step overlapping the write          %8.1f ms (median)\n"
      "  stall per save                      %8.1f ms (call + extra time of the overlapped step)\n"
      "  synchronous save, for comparison    %8.1f ms\n",
      static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
      state_bytes / 1048576.0, num_threads(), median(plain) * 1e3, median(calls) * 1e3,
      calls.size(), median(overlapped) * 1e3,
      (median(calls) + std::max(0.0, median(overlapped) - median(plain))) * 1e3, sync_s * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app("Checkpoint save/load throughput beside dd and PyTorch DCP; async save stall");
  app.add_option("--np", f.np, "processes (Gloo over loopback)")->check(CLI::Range(1, 16));
  app.add_option("--mib", f.mib, "MiB of state in all")->check(CLI::PositiveNumber);
  app.add_option("--tensors", f.tensors, "tensors in the state")->check(CLI::PositiveNumber);
  app.add_option("--rounds", f.rounds, "rounds (dd, ours and PyTorch's alternate)");
  app.add_option("--dir", f.dir, "folder on the disk to measure");
  app.add_option("--torch", f.torch, "python with torch, or 'auto' (scripts/torch-venv.sh)");
  app.add_flag("!--no-stall", f.stall, "skip the async-save stall measurement");
  CLI11_PARSE(app, argc, argv);
  if (!gloo::is_available()) {
    std::printf("skipped: this build has no Gloo backend\n");
    return 0;
  }
  const int64_t bytes = rows_of(f, kCols) * kCols * 4 * f.tensors;
  std::printf(
      "bench_checkpoint: %lld tensors f32[%lld, %lld], %.1f MiB in all, sharded over %d "
      "processes; folder %s; load %s\ncpu: %s\n",
      static_cast<long long>(f.tensors), static_cast<long long>(rows_of(f, kCols)),
      static_cast<long long>(kCols), bytes / 1048576.0, f.np, f.dir.c_str(),
      bench::load_average().c_str(), bench::cpu_features({}).c_str());
  const std::string python = bench::torch_python(f.torch, TESSEL_SOURCE_DIR);

  std::map<std::string, std::vector<double>> save_s, load_s;
  std::string version;
  for (int round = 0; round < f.rounds; ++round) {
    const auto [dd_w, dd_r] = run_dd(f, bytes);
    save_s["dd"].push_back(dd_w);
    load_s["dd"].push_back(dd_r);
    const auto [ow, orr] = run_ours(f);
    save_s["tessel"].push_back(ow);
    load_s["tessel"].push_back(orr);
    if (!python.empty()) {
      const auto [tw, tr] = run_torch(f, python, &version);
      if (tw > 0) {
        save_s["torch dcp"].push_back(tw);
        load_s["torch dcp"].push_back(tr);
      }
    }
  }
  std::printf("torch: %s\n\n", !version.empty() ? ("PyTorch " + version).c_str()
                                                : "skipped (give --torch PYTHON or --torch auto)");
  std::printf("%-28s %10s %10s %10s %10s\n", "", "save s", "save GB/s", "load s", "load GB/s");
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"dd", "dd (one sequential stream)"}, {"tessel", "tessel"}, {"torch dcp", "torch dcp"}};
  for (const auto& [key, label] : rows) {
    if (save_s[key].empty()) continue;
    const double s = median(save_s[key]), l = median(load_s[key]);
    std::printf("%-28s %10.3f %10.2f %10.3f %10.2f\n", label.c_str(), s,
                s > 0 ? bytes / s / 1e9 : 0, l, l > 0 ? bytes / l / 1e9 : 0);
  }
  if (f.stall) measure_stall(f);
  return 0;
}
