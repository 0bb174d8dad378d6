#pragma once
// What the CPU training benches (gpt_train, llama_train) share: the flags after the model's, the
// token batches, the header lines about the CPU and kernels, and the harness around the
// trainers: tessel f32 and bf16 under autocast beside a PyTorch child's eager and torch.compile
// modes (f32, bf16 under torch.autocast), warm-up, alternating timed rounds (bench_host.h), and
// tokens/s per contender with the ratios. Each bench keeps its model's flags and what its PyTorch
// script loads.
//
// The PyTorch script answers "ready <version> <cpu capability> <threads>" once started, then one
// line per command: "load <dir> <shape...>" -> "ok <f32 loss> <bf16 loss>" (batch 0, before
// training), "warm <mode> <steps>" -> "ok" or why not, "steps <mode> <steps>" -> the steps'
// "wall:cpu" seconds; the modes are eager_f32, eager_bf16, compile_f32 and compile_bf16.

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_dnnl.h"
#include "bench_host.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::bench {

// The flags every training bench has after its model's.
struct TrainBenchOptions {
  int64_t batches = 4;  // distinct batches, cycled
  int steps = 4;        // per contender per round
  int warmup = 8;       // untimed steps per contender before the rounds
  int rounds = 5;
  int threads = 2;
  std::string torch;         // --torch as given: a python, "auto" or none
  std::string torch_python;  // the python that runs PyTorch's side; empty: tessel only
  std::string torch_script;
  std::string contenders = "all";

  // --batches, --steps, --rounds, --warmup, --threads, --torch, --torch-script, --contenders on a
  // CLI11 app.
  template <class App>
  void add_options(App& app) {
    app.add_option("--batches", batches, "distinct batches, cycled");
    app.add_option("--steps", steps, "training steps per contender per round");
    app.add_option("--rounds", rounds, "alternating rounds");
    app.add_option("--warmup", warmup,
                   "untimed steps per contender first (PyTorch's first steps after "
                   "torch.compile or start-up take up to seconds)");
    app.add_option("--threads", threads, "threads, both sides (0: one per core)");
    app.add_option("--torch", torch,
                   "a python with torch, or 'auto' (scripts/torch-venv.sh's venv, made on first "
                   "use); none: tessel only");
    app.add_option("--torch-script", torch_script, "PyTorch's side of the bench");
    app.add_option("--contenders", contenders,
                   "comma-separated subset of tessel_f32, tessel_bf16, eager_f32, eager_bf16, "
                   "compile_f32, compile_bf16 (default all)");
  }

  // Whether --contenders names `key`.
  bool wanted(const std::string& key) const {
    return contenders == "all" ||
           ("," + contenders + ",").find("," + key + ",") != std::string::npos;
  }
};

// One batch: tokens and next-token targets, (B, T) i64 row-major.
struct TokenBatch {
  std::vector<int64_t> tokens, targets;
};

// `count` batches of `tokens` uniform tokens and targets below `vocab`, from a fixed seed.
inline std::vector<TokenBatch> make_token_batches(int64_t count, int64_t tokens, int64_t vocab) {
  std::mt19937_64 rng(7);
  std::vector<TokenBatch> out(static_cast<size_t>(count));
  for (TokenBatch& b : out) {
    for (int64_t i = 0; i < tokens; ++i) {
      b.tokens.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
      b.targets.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
    }
  }
  return out;
}

// tessel's side: a model (nn::GPT, nn::Llama), its AdamW and the batches as (batch, block)
// tensors. step() is one training step: forward and mean cross-entropy (under autocast for
// bf16), backward, gradient clipping to norm 1.0, AdamW (lr 1e-3, betas 0.9/0.95, weight decay
// 0.1), zero_grad.
template <class Model>
class TesselTrainer {
 public:
  template <class ModelConfig>
  TesselTrainer(const ModelConfig& config, const std::vector<TokenBatch>& batches, int64_t batch,
                int64_t block, bool bf16)
      : model_(config),
        opt_(model_.parameters(), {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1}),
        bf16_(bf16) {
    for (const TokenBatch& b : batches) {
      tokens_.push_back(from_vector<int64_t>(b.tokens, {batch, block}));
      targets_.push_back(from_vector<int64_t>(b.targets, {batch, block}));
    }
  }

  Model& model() { return model_; }

  Tensor loss(size_t batch) {
    std::optional<AutocastGuard> autocast;
    if (bf16_) autocast.emplace(DType::kBF16);
    return Model::loss(model_(tokens_[batch]), targets_[batch]);
  }

  void step() {
    const Tensor l = loss(next_++ % tokens_.size());
    backward(l);
    nn::optim::clip_grad_norm(model_.parameters(), 1.0);
    opt_.step();
    opt_.zero_grad();
  }

 private:
  Model model_;
  nn::optim::AdamW opt_;
  bool bf16_;
  std::vector<Tensor> tokens_, targets_;
  size_t next_ = 0;
};

// The header's lines after the model's: the CPU's features, whether AMX tiles are usable, the
// attention and GEMM kernels tessel runs, and the load average.
inline void print_cpu_training_header() {
  namespace attention = kernels::attention;
  const attention::FlashCpuOptions flash;
  std::printf(
      "CPU: %s; AMX tiles usable: %s\n",
      cpu_features({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"})
          .c_str(),
      attention::cpu_isa_supported(attention::CpuIsa::kAmx) ? "yes" : "no");
  std::printf("tessel kernels: attention f32 %s, bf16 %s; GEMM oneDNN %s\n",
              std::string(attention::flash_cpu_kernel_name(DType::kF32, flash)).c_str(),
              std::string(attention::flash_cpu_kernel_name(DType::kBF16, flash)).c_str(),
              dnnl_isa_name());
  std::printf("load average at the start: %s\n", load_average().c_str());
}

// What a bench hands the harness: tessel's two trainers and what PyTorch's side loads.
struct TrainBenchSides {
  std::string name;  // "gpt_train": names the private folder of PyTorch's inputs
  int64_t tokens_per_step = 0;
  const std::vector<TokenBatch>* batches = nullptr;  // written to <dir>/data.bin for PyTorch
  std::function<void()> tessel_f32_step, tessel_bf16_step;
  double tessel_loss[2] = {NAN, NAN};  // batch 0 before training: f32, bf16
  // Writes the initial weights (and anything else the script reads) into `dir`.
  std::function<void(const std::string& dir)> write_inputs;
  // "load <dir> <shape...>": the script's command that builds its models from `dir`.
  std::function<std::string(const std::string& dir)> load_command;
};

// Starts PyTorch's side where --torch asks for it (skipping it with a printed reason where it
// cannot), warms every contender up, times --rounds alternating rounds and prints the table and
// the ratios of tokens/s. The process's exit status: 1 when the PyTorch child stopped answering.
inline int run_train_bench(const TrainBenchOptions& o, const TrainBenchSides& sides) {
  struct Contender {
    std::string name;            // as printed
    std::string key;             // for --contenders and the PyTorch child's mode
    std::function<void()> step;  // empty for PyTorch's
    Calls calls;
  };
  std::vector<Contender> contenders;
  if (o.wanted("tessel_f32"))
    contenders.push_back({"tessel f32", "tessel_f32", sides.tessel_f32_step, {}});
  if (o.wanted("tessel_bf16")) {
    contenders.push_back({"tessel bf16 autocast", "tessel_bf16", sides.tessel_bf16_step, {}});
  }

  // PyTorch: the initial weights and the batches go through files in a private folder.
  const std::string dir = "/tmp/tessel_" + sides.name + "_" + std::to_string(getpid());
  PeerProcess torch;
  bool with_torch = false;
  double torch_loss[2] = {NAN, NAN};
  if (o.torch.empty()) {
    std::printf("torch: skipped: no --torch PYTHON or --torch auto given\n");
  } else if (o.torch_python.empty()) {
    std::printf(
        "torch: skipped: scripts/torch-venv.sh found no torch and could not install it "
        "(its messages are above)\n");
  } else {
    std::system(("mkdir -p " + dir).c_str());
    sides.write_inputs(dir);
    {
      std::ofstream data(dir + "/data.bin", std::ios::binary);
      for (const TokenBatch& b : *sides.batches) {
        data.write(reinterpret_cast<const char*>(b.tokens.data()), sides.tokens_per_step * 8);
        data.write(reinterpret_cast<const char*>(b.targets.data()), sides.tokens_per_step * 8);
      }
    }
    std::string info, line, ok;
    with_torch = torch.start(o.torch_python, {o.torch_script, std::to_string(o.threads)}) &&
                 torch.read_line(&line) && line.rfind("ready ", 0) == 0;
    if (!with_torch) {
      info = o.torch_python + " did not start torch (see its error above)";
    } else {
      info = "version, CPU capability, threads: " + line.substr(6);
      std::istringstream loaded;
      if (torch.ask(sides.load_command(dir), &line)) loaded.str(line);
      with_torch = static_cast<bool>(loaded >> ok >> torch_loss[0] >> torch_loss[1]) && ok == "ok";
      if (!with_torch) info = "it could not build the model from " + dir + " (see its error above)";
    }
    if (!with_torch) torch.stop();
    std::printf("torch: %s: %s%s\n", o.torch_python.c_str(),
                with_torch ? "" : "skipped: ", info.c_str());
  }
  std::printf("loss of batch 0 before training: tessel f32 %.6f, bf16 %.6f", sides.tessel_loss[0],
              sides.tessel_loss[1]);
  if (with_torch) {
    std::printf("; torch f32 %.6f, bf16 %.6f (the same model on both sides)", torch_loss[0],
                torch_loss[1]);
  }
  std::printf("\n");
  if (with_torch) {
    for (const std::string mode : {"eager_f32", "eager_bf16", "compile_f32", "compile_bf16"}) {
      if (!o.wanted(mode)) continue;
      std::fprintf(stderr, "warming torch %s up (torch.compile compiles here)...\n", mode.c_str());
      std::string why;
      if (!torch.ask("warm " + mode + " " + std::to_string(o.warmup), &why)) {
        why = "the PyTorch process stopped answering";
      }
      if (why != "ok") {
        std::printf("torch: %s skipped: %s\n", mode.c_str(), why.c_str());
        continue;
      }
      const std::string name = std::string("torch ") +
                               (mode.starts_with("eager") ? "eager" : "compile") +
                               (mode.ends_with("bf16") ? " bf16 autocast" : " f32");
      contenders.push_back({name, mode, nullptr, {}});
    }
  }

  for (Contender& k : contenders) {
    if (!k.step) continue;
    for (int i = 0; i < o.warmup; ++i) k.step();
    k.calls.warm = true;
  }
  for (int r = 0; r < o.rounds; ++r) {
    for (Contender& k : contenders) {
      if (k.step) {
        time_round(o.steps, 0.0, k.step, k.calls, with_torch ? torch.pid() : 0);
      } else if (!torch.ask_times("steps " + k.key + " " + std::to_string(o.steps), k.calls)) {
        std::printf("torch: %s stopped answering\n", k.key.c_str());
        std::system(("rm -rf " + dir).c_str());
        return 1;
      }
    }
  }

  std::printf("\n%-28s %9s %9s %9s %9s %6s %11s\n", "contender", "ms/step", "tok/s", "min ms",
              "max ms", "steps", "CPU-s/step");
  std::map<std::string, double> rate;
  for (const Contender& k : contenders) {
    const Timing t = summarize(k.calls);
    rate[k.key] = static_cast<double>(sides.tokens_per_step) / t.wall;
    std::printf("%-28s %9.1f %9.0f %9.1f %9.1f %6d %11.3f\n", k.name.c_str(), 1e3 * t.wall,
                rate[k.key], 1e3 * t.wall_lo, 1e3 * t.wall_hi, t.calls, t.cpu);
  }
  if (rate.size() > 1) std::printf("\nratios of tokens/s:\n");
  for (const char* dtype : {"f32", "bf16"}) {
    const std::string ours = std::string("tessel_") + dtype;
    if (!rate.contains(ours)) continue;
    for (const char* peer : {"eager", "compile"}) {
      const std::string theirs = std::string(peer) + "_" + dtype;
      if (!rate.contains(theirs)) continue;
      std::printf("  %-5s tessel / torch %-8s %6.2fx\n", dtype, peer, rate[ours] / rate[theirs]);
    }
  }
  if (rate.contains("tessel_f32") && rate.contains("tessel_bf16")) {
    std::printf("  tessel bf16 / tessel f32        %6.2fx\n",
                rate["tessel_bf16"] / rate["tessel_f32"]);
  }
  std::printf("load average at the end: %s\n", load_average().c_str());
  if (!o.torch_python.empty()) std::system(("rm -rf " + dir).c_str());
  return 0;
}

}  // namespace tessel::bench
