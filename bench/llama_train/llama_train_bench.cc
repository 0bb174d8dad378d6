// bench/llama_train: Llama training throughput of tessel, f32 and bf16 under AutocastGuard,
// beside PyTorch eager and torch.compile, f32 and bf16 under torch.autocast: the same model
// (nn::Llama, by default LlamaConfig::tiny(): RMSNorm, RoPE with Llama 3 scaling, SwiGLU,
// grouped-query attention, untied head), the same initial weights (tessel writes them in Hugging
// Face's names, PyTorch loads them; the RoPE frequencies too) and the same batches, timed in
// alternating rounds of one run. The pattern of bench/gpt_train, whose comment below applies.
//
//   bench/llama_train/run.sh [flags]        # builds this, then runs it with --torch auto
//   llama_train [--dim 64] [--layers 2] [--heads 4] [--kv-heads 2] [--hidden 128] [--vocab 256]
//               [--block 256] [--batch 8] [--steps 4] [--rounds 5] [--warmup 8] [--threads 2]
//               [--torch PYTHON|auto] [--contenders all]
//
// A training step, on both sides: forward and mean cross-entropy (under autocast for bf16),
// backward, gradient clipping to norm 1.0, fused AdamW (lr 1e-3, betas 0.9/0.95, weight decay
// 0.1), zero_grad. Each contender trains its own copy of the model from the same weights, first
// --warmup steps untimed (PyTorch's first steps after start-up take up to seconds); every
// round runs --steps steps of each contender in turn, each started once no thread of this
// process or of the PyTorch child still burns CPU (OpenMP teams spin after each call), so all
// share whatever else runs on the machine alike. Figures are medians over the rounds' steps.
// The header prints the CPU's features, whether AMX tiles are usable, the kernels that run,
// PyTorch's version and CPU capability, and the load average; the initial losses of batch 0 on
// both sides show that the two models are the same.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../bench_dnnl.h"
#include "../bench_host.h"
#include "../bench_processes.h"  // torch_python
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/llama/rope.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;
using namespace tessel::bench;

struct Config {
  nn::LlamaConfig model = nn::LlamaConfig::tiny();
  int64_t block = 256;
  int64_t batch = 8;
  int64_t batches = 4;  // distinct batches, cycled
  int steps = 4;        // per contender per round
  int warmup = 8;       // untimed steps per contender before the rounds
  int rounds = 5;
  int threads = 2;
  std::string torch;         // --torch as given: a python, "auto" or none
  std::string torch_python;  // the python that runs PyTorch's side; empty: tessel only
  std::string torch_script = TESSEL_SOURCE_DIR "/bench/llama_train/llama_train_torch.py";
  std::string contenders = "all";
};

// One batch: tokens and next-token targets, (B, T) i64.
struct Batch {
  std::vector<int64_t> tokens, targets;
};

std::vector<Batch> make_batches(const Config& c) {
  std::mt19937_64 rng(7);
  std::vector<Batch> out(static_cast<size_t>(c.batches));
  for (Batch& b : out) {
    for (int64_t i = 0; i < c.batch * c.block; ++i) {
      b.tokens.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.model.vocab_size)));
      b.targets.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.model.vocab_size)));
    }
  }
  return out;
}

// tessel's side: a model, its optimizer and the batches; step() is one training step.
class TesselTrainer {
 public:
  TesselTrainer(const Config& c, const std::vector<Batch>& batches, bool bf16)
      : model_(c.model),
        opt_(model_.parameters(), {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1}),
        bf16_(bf16) {
    for (const Batch& b : batches) {
      tokens_.push_back(from_vector<int64_t>(b.tokens, {c.batch, c.block}));
      targets_.push_back(from_vector<int64_t>(b.targets, {c.batch, c.block}));
    }
  }

  nn::Llama& model() { return model_; }

  Tensor loss(size_t batch) {
    std::optional<AutocastGuard> autocast;
    if (bf16_) autocast.emplace(DType::kBF16);
    return nn::Llama::loss(model_(tokens_[batch]), targets_[batch]);
  }

  void step() {
    const Tensor l = loss(next_++ % tokens_.size());
    backward(l);
    nn::optim::clip_grad_norm(model_.parameters(), 1.0);
    opt_.step();
    opt_.zero_grad();
  }

 private:
  nn::Llama model_;
  nn::optim::AdamW opt_;
  bool bf16_;
  std::vector<Tensor> tokens_, targets_;
  size_t next_ = 0;
};

// PyTorch's side (llama_train_torch.py in a child process).
class TorchPeer {
 public:
  ~TorchPeer() { child_.stop(); }

  // Starts the script; false with the reason in *info when it cannot, else *info says
  // "<version> <cpu capability> <threads>".
  bool start(const Config& c, std::string* info) {
    std::string line;
    if (!child_.start(c.torch_python, {c.torch_script, std::to_string(c.threads)}) ||
        !child_.read_line(&line) || line.rfind("ready ", 0) != 0) {
      *info = c.torch_python + " did not start torch (see its error above)";
      child_.stop();
      return false;
    }
    *info = line.substr(6);
    return true;
  }

  // Builds the four models from dir's weights, RoPE frequencies and batches; the losses of batch
  // 0 (f32, bf16).
  bool load(const Config& c, const std::string& dir, double* f32_loss, double* bf16_loss) {
    const nn::LlamaConfig& m = c.model;
    std::ostringstream cmd;
    cmd << "load " << dir << " " << m.vocab_size << " " << m.dim << " " << m.n_layers << " "
        << m.n_heads << " " << m.kv_heads() << " " << m.head_size() << " " << m.ffn_hidden() << " "
        << (m.tie_word_embeddings ? 1 : 0) << " " << m.norm_eps << " " << c.block << " " << c.batch
        << " " << c.batches;
    std::string line, ok;
    if (!child_.ask(cmd.str(), &line)) return false;
    std::istringstream in(line);
    return static_cast<bool>(in >> ok >> *f32_loss >> *bf16_loss) && ok == "ok";
  }

  pid_t pid() const { return child_.pid(); }

  // Runs `steps` untimed steps of `mode`; false with the reason in *why when it cannot.
  bool warm(const std::string& mode, int steps, std::string* why) {
    std::string line;
    if (!child_.ask("warm " + mode + " " + std::to_string(steps), &line)) {
      *why = "the PyTorch process stopped answering";
      return false;
    }
    *why = line;
    return line == "ok";
  }

  // Runs `steps` steps of `mode` once the child is quiet; appends their times.
  bool steps(const std::string& mode, int steps, Calls& calls) {
    return child_.ask_times("steps " + mode + " " + std::to_string(steps), calls);
  }

 private:
  PeerProcess child_;
};

struct Contender {
  std::string name;  // as printed
  std::string key;   // for --contenders and the PyTorch child's mode
  bool bf16 = false;
  TesselTrainer* tessel = nullptr;  // null for PyTorch's
  Calls calls;
};

bool wanted(const Config& c, const std::string& key) {
  return c.contenders == "all" ||
         ("," + c.contenders + ",").find("," + key + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{
      "Llama training tokens/s: tessel f32 and bf16 autocast vs PyTorch eager and "
      "torch.compile, same model, weights and data, alternating rounds"};
  app.add_option("--dim", c.model.dim, "hidden size");
  app.add_option("--layers", c.model.n_layers, "decoder layers");
  app.add_option("--heads", c.model.n_heads, "query heads");
  app.add_option("--kv-heads", c.model.n_kv_heads, "key/value heads");
  app.add_option("--hidden", c.model.ffn_hidden_size, "the MLP's hidden size");
  app.add_option("--vocab", c.model.vocab_size, "vocabulary size");
  app.add_option("--block", c.block, "context length (tokens per sequence)");
  app.add_option("--batch", c.batch, "sequences per step");
  app.add_option("--batches", c.batches, "distinct batches, cycled");
  app.add_option("--steps", c.steps, "training steps per contender per round");
  app.add_option("--rounds", c.rounds, "alternating rounds");
  app.add_option("--warmup", c.warmup,
                 "untimed steps per contender first (PyTorch's first steps after torch.compile "
                 "or start-up take up to seconds)");
  app.add_option("--threads", c.threads, "threads, both sides (0: one per core)");
  app.add_option("--torch", c.torch,
                 "a python with torch, or 'auto' (scripts/torch-venv.sh's venv, made on first "
                 "use); none: tessel only");
  app.add_option("--torch-script", c.torch_script, "PyTorch's side of the bench");
  app.add_option("--contenders", c.contenders,
                 "comma-separated subset of tessel_f32, tessel_bf16, eager_f32, eager_bf16, "
                 "compile_f32, compile_bf16 (default all)");
  CLI11_PARSE(app, argc, argv);
  c.model.max_seq_len = std::max(c.model.max_seq_len, c.block);
  c.model.seed = 1;
  set_num_threads(c.threads);
  c.threads = num_threads();
  c.torch_python = torch_python(c.torch, TESSEL_SOURCE_DIR);

  const std::vector<Batch> batches = make_batches(c);
  const int64_t tokens = c.batch * c.block;
  const nn::LlamaConfig& m = c.model;
  std::printf(
      "Llama training: %lld layers, dim %lld, %lld heads, %lld K/V heads, head dim %lld, MLP "
      "%lld, vocab %lld, rope theta %g%s, %s head; context %lld, batch %lld (%lld tokens/step), "
      "%lld parameters; %d threads on each side\n",
      static_cast<long long>(m.n_layers), static_cast<long long>(m.dim),
      static_cast<long long>(m.n_heads), static_cast<long long>(m.kv_heads()),
      static_cast<long long>(m.head_size()), static_cast<long long>(m.ffn_hidden()),
      static_cast<long long>(m.vocab_size), m.rope_theta,
      m.rope_scaling ? " with llama3 scaling" : "", m.tie_word_embeddings ? "tied" : "untied",
      static_cast<long long>(c.block), static_cast<long long>(c.batch),
      static_cast<long long>(tokens), static_cast<long long>(m.num_parameters()), c.threads);
  const kernels::attention::FlashCpuOptions flash;
  std::printf(
      "CPU: %s; AMX tiles usable: %s\n",
      cpu_features({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"})
          .c_str(),
      kernels::attention::cpu_isa_supported(kernels::attention::CpuIsa::kAmx) ? "yes" : "no");
  std::printf("tessel kernels: attention f32 %s, bf16 %s; GEMM oneDNN %s\n",
              std::string(kernels::attention::flash_cpu_kernel_name(DType::kF32, flash)).c_str(),
              std::string(kernels::attention::flash_cpu_kernel_name(DType::kBF16, flash)).c_str(),
              dnnl_isa_name());
  std::printf("load average at the start: %s\n", load_average().c_str());

  TesselTrainer tessel_f32(c, batches, false), tessel_bf16(c, batches, true);
  std::vector<Contender> contenders;
  if (wanted(c, "tessel_f32")) {
    contenders.push_back({"tessel f32", "tessel_f32", false, &tessel_f32, {}});
  }
  if (wanted(c, "tessel_bf16")) {
    contenders.push_back({"tessel bf16 autocast", "tessel_bf16", true, &tessel_bf16, {}});
  }
  double tessel_loss[2];
  {
    NoGradGuard no_grad;
    tessel_loss[0] = item(tessel_f32.loss(0));
    tessel_loss[1] = item(tessel_bf16.loss(0));
  }

  // PyTorch: the initial weights and the batches go through files in a private folder.
  const std::string dir = "/tmp/tessel_llama_train_" + std::to_string(getpid());
  TorchPeer torch;
  bool with_torch = false;
  double torch_loss[2] = {NAN, NAN};
  if (c.torch.empty()) {
    std::printf("torch: skipped: no --torch PYTHON or --torch auto given\n");
  } else if (c.torch_python.empty()) {
    std::printf(
        "torch: skipped: scripts/torch-venv.sh found no torch and could not install it "
        "(its messages are above)\n");
  } else {
    std::system(("mkdir -p " + dir).c_str());
    tessel_f32.model().save(dir + "/init.safetensors");
    {
      // The RoPE frequencies as tessel computes them (Llama 3 scaling included), raw f32.
      const Tensor inv_freq = kernels::rope_inv_freq(m.head_size(), m.rope_theta, m.rope_scaling);
      std::ofstream freq(dir + "/inv_freq.bin", std::ios::binary);
      freq.write(static_cast<const char*>(inv_freq.data_ptr()), inv_freq.numel() * 4);
    }
    {
      std::ofstream data(dir + "/data.bin", std::ios::binary);
      for (const Batch& b : batches) {
        data.write(reinterpret_cast<const char*>(b.tokens.data()), tokens * 8);
        data.write(reinterpret_cast<const char*>(b.targets.data()), tokens * 8);
      }
    }
    std::string info;
    with_torch = torch.start(c, &info);
    if (with_torch && !torch.load(c, dir, &torch_loss[0], &torch_loss[1])) {
      with_torch = false;
      info = "it could not build the model from " + dir + " (see its error above)";
    }
    std::printf("torch: %s: %s%s\n", c.torch_python.c_str(), with_torch ? "" : "skipped: ",
                with_torch ? ("version, CPU capability, threads: " + info).c_str() : info.c_str());
  }
  std::printf("loss of batch 0 before training: tessel f32 %.6f, bf16 %.6f", tessel_loss[0],
              tessel_loss[1]);
  if (with_torch) {
    std::printf("; torch f32 %.6f, bf16 %.6f (the same model on both sides)", torch_loss[0],
                torch_loss[1]);
  }
  std::printf("\n");
  if (with_torch) {
    for (const char* mode : {"eager_f32", "eager_bf16", "compile_f32", "compile_bf16"}) {
      if (!wanted(c, mode)) continue;
      std::fprintf(stderr, "warming torch %s up (torch.compile compiles here)...\n", mode);
      std::string why;
      if (!torch.warm(mode, c.warmup, &why)) {
        std::printf("torch: %s skipped: %s\n", mode, why.c_str());
        continue;
      }
      const bool bf16 = std::string(mode).ends_with("bf16");
      const std::string name = std::string("torch ") +
                               (std::string(mode).starts_with("eager") ? "eager" : "compile") +
                               (bf16 ? " bf16 autocast" : " f32");
      contenders.push_back({name, mode, bf16, nullptr, {}});
    }
  }
  if (!with_torch) {
    std::erase_if(contenders, [](const Contender& k) { return k.tessel == nullptr; });
  }

  for (Contender& k : contenders) {
    if (k.tessel == nullptr) continue;
    for (int i = 0; i < c.warmup; ++i) k.tessel->step();
    k.calls.warm = true;
  }
  for (int r = 0; r < c.rounds; ++r) {
    for (Contender& k : contenders) {
      if (k.tessel != nullptr) {
        time_round(
            c.steps, 0.0, [&] { k.tessel->step(); }, k.calls, with_torch ? torch.pid() : 0);
      } else if (!torch.steps(k.key, c.steps, k.calls)) {
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
    rate[k.key] = static_cast<double>(tokens) / t.wall;
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
  if (!c.torch_python.empty()) std::system(("rm -rf " + dir).c_str());
  return 0;
}
