// bench_fsdp: GPT training throughput under tessel's FSDP, DDP and a single process, beside
// PyTorch's FSDP2 (fully_shard), DistributedDataParallel and a single process, on CPU over Gloo
// with the same GPT config, global batch and world, in the same run.
//
//   bench_fsdp --np 2                          # ours only
//   bench_fsdp --np 2 --torch auto             # + PyTorch (venv from scripts/torch-venv.sh)
//   bench_fsdp --np 2 --embd 256 --layers 4 --seq 256 --batch 8 --rounds 2 --torch auto
//
// Setups: single (one process, --np threads), single1 (one process, one thread), fsdp1 (FSDP over
// one process, one thread), fsdp and ddp (--np processes, one thread each). Tokens/s is the
// global batch over the median step time; "FSDP host cost" is fsdp1 - single1 per step, what the
// wrapper adds with no communication to hide. Rounds alternate ours and PyTorch's.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench_host.h"
#include "bench_procs.h"
#include "tessel/base/clock.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;

struct Flags {
  int np = 2;
  int64_t vocab = 256, seq = 256, layers = 4, heads = 4, embd = 256, batch = 8;
  int steps = 6, warmup = 2, rounds = 2;
  std::string torch;
  std::vector<std::string> setups = {"single", "single1", "fsdp1", "fsdp", "ddp"};
};

nn::GptConfig config_of(const Flags& f) {
  return {.vocab_size = f.vocab,
          .block_size = f.seq,
          .n_layer = f.layers,
          .n_head = f.heads,
          .n_embd = f.embd,
          .seed = 1};
}

// Seconds of each timed step (after the warm-up) of training `model` on this rank's rows;
// `group` (may be null) lines the ranks up before each step.
std::vector<double> train(nn::GPT& model, const Flags& f, int rank, int world,
                          ProcessGroup* group) {
  nn::optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  Generator gen(1);
  const int64_t rows = f.batch / world;
  std::vector<double> times;
  for (int step = 0; step < f.steps + f.warmup; ++step) {
    const Tensor tokens =
        to(mul(rand({f.batch, f.seq + 1}, gen), static_cast<double>(f.vocab - 1)), DType::kI64);
    const Tensor x = narrow(narrow(tokens, 1, 0, f.seq), 0, rank * rows, rows);
    const Tensor y = narrow(narrow(tokens, 1, 1, f.seq), 0, rank * rows, rows);
    if (group) group->barrier();
    const Stopwatch watch;
    backward(nn::GPT::loss(model(x), y));
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    if (step >= f.warmup) times.push_back(watch.elapsed_seconds());
  }
  return times;
}

void shard(nn::GPT& model, const DeviceMesh& mesh, int64_t layers) {
  for (int64_t i = 0; i < layers; ++i) {
    fully_shard(model.submodule("transformer.h").child(std::to_string(i)), mesh);
  }
  fully_shard(model, mesh);
}

// One setup in this process (single, single1, fsdp1): median seconds per step.
double run_local(const Flags& f, const std::string& setup) {
  set_num_threads(setup == "single" ? f.np : 1);
  nn::GPT model(config_of(f));
  if (setup == "fsdp1") {
    double result = 0;
    threads::run_ranks(1, [&](ProcessGroup& pg) {
      const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {1}, {"dp"});
      shard(model, mesh, f.layers);
      result = bench::median(train(model, f, 0, 1, nullptr));
    });
    return result;
  }
  return bench::median(train(model, f, 0, 1, nullptr));
}

// fsdp or ddp over np forked processes (Gloo): rank 0's median seconds per step.
double run_processes(const Flags& f, const std::string& setup) {
  return bench::run_forked(f.np, "fsdp-" + setup, [&](int rank, std::shared_ptr<ProcessGroup> pg) {
    set_num_threads(1);
    nn::GPT model(config_of(f));
    const DeviceMesh mesh = init_device_mesh(pg, {f.np}, {"dp"});
    std::unique_ptr<DDPModule> ddp;
    if (setup == "fsdp") {
      shard(model, mesh, f.layers);
    } else {
      ddp = std::make_unique<DDPModule>(replicate(model, mesh));
    }
    return bench::median(train(model, f, rank, f.np, pg.get()));
  });
}

// PyTorch's medians by setup, from bench/fsdp/torch_fsdp.py.
std::map<std::string, double> run_torch(const Flags& f, const std::string& python,
                                        std::string* version) {
  const std::string cmd = fmt::format(
      "PYTHONWARNINGS=ignore '{}' '{}/bench/fsdp/torch_fsdp.py' --np {} --vocab {} --seq {} "
      "--layers {} --heads {} --embd {} --batch {} --steps {} --warmup {} 2>/dev/null",
      python, TESSEL_SOURCE_DIR, f.np, f.vocab, f.seq, f.layers, f.heads, f.embd, f.batch, f.steps,
      f.warmup);
  return bench::run_peer(cmd, version);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app("GPT training under FSDP, DDP and one process, beside PyTorch's");
  app.add_option("--np", f.np, "processes for fsdp and ddp (Gloo over loopback)")
      ->check(CLI::Range(2, 16));
  app.add_option("--vocab", f.vocab);
  app.add_option("--seq", f.seq);
  app.add_option("--layers", f.layers);
  app.add_option("--heads", f.heads);
  app.add_option("--embd", f.embd);
  app.add_option("--batch", f.batch, "global batch (sequences)");
  app.add_option("--steps", f.steps, "timed steps per setup and round");
  app.add_option("--warmup", f.warmup, "untimed steps first");
  app.add_option("--rounds", f.rounds, "rounds (ours and PyTorch's alternate)");
  app.add_option("--torch", f.torch, "python with torch, or 'auto' (scripts/torch-venv.sh)");
  app.add_option("--setups", f.setups, "which setups to run (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"single", "single1", "fsdp1", "fsdp", "ddp"}));
  CLI11_PARSE(app, argc, argv);
  if (!gloo::is_available()) {
    std::printf("skipped: this build has no Gloo backend\n");
    return 0;
  }
  std::printf(
      "bench_fsdp: GPT %lld layers, %lld wide, %lld heads, context %lld, vocab %lld; "
      "global batch %lld; %d processes for fsdp/ddp; load %s\ncpu: %s\n",
      static_cast<long long>(f.layers), static_cast<long long>(f.embd),
      static_cast<long long>(f.heads), static_cast<long long>(f.seq),
      static_cast<long long>(f.vocab), static_cast<long long>(f.batch), f.np,
      bench::load_average().c_str(),
      bench::cpu_features({"avx512f", "avx512_bf16", "amx_tile"}).c_str());
  const std::string python = bench::torch_python(f.torch, TESSEL_SOURCE_DIR);
  const std::vector<std::string>& setups = f.setups;
  std::map<std::string, std::vector<double>> ours, theirs;
  std::string version;
  for (int round = 0; round < f.rounds; ++round) {
    for (const std::string& s : setups) {
      ours[s].push_back(s == "fsdp" || s == "ddp" ? run_processes(f, s) : run_local(f, s));
    }
    if (!python.empty()) {
      for (auto& [s, seconds] : run_torch(f, python, &version)) theirs[s].push_back(seconds);
    }
  }
  const bool with_torch = !theirs.empty();
  std::printf("torch: %s\n\n", with_torch ? ("PyTorch " + version).c_str()
                                          : "skipped (give --torch PYTHON or --torch auto)");
  const double tokens = static_cast<double>(f.batch * f.seq);
  std::printf("%-8s %12s %12s", "setup", "ours tok/s", "ms/step");
  if (with_torch) std::printf(" %12s %12s %9s", "torch tok/s", "ms/step", "ours/torch");
  std::printf("\n");
  for (const std::string& s : setups) {
    const double o = bench::median(ours[s]);
    std::printf("%-8s %12.0f %12.1f", s.c_str(), o > 0 ? tokens / o : 0, o * 1e3);
    if (with_torch && !theirs[s].empty()) {
      const double t = bench::median(theirs[s]);
      std::printf(" %12.0f %12.1f %9.2f", tokens / t, t * 1e3, t / o);
    }
    std::printf("\n");
  }
  if (ours["fsdp1"].empty() || ours["single1"].empty()) return 0;
  const double host = bench::median(ours["fsdp1"]) - bench::median(ours["single1"]);
  std::printf("\nFSDP host cost per step (fsdp1 - single1): ours %.1f ms", host * 1e3);
  if (with_torch && !theirs["fsdp1"].empty() && !theirs["single1"].empty()) {
    std::printf(", torch %.1f ms",
                (bench::median(theirs["fsdp1"]) - bench::median(theirs["single1"])) * 1e3);
  }
  std::printf("\n");
  return 0;
}
