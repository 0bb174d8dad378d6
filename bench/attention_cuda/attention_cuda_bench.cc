// bench/attention_cuda: TFLOP/s of tessel's fused CUDA attention (flash_cuda, cudnn) beside
// PyTorch's F.scaled_dot_product_attention with the same backend forced (FLASH_ATTENTION,
// CUDNN_ATTENTION), on identical bf16 inputs on the same GPU, in one run.
//
//   attention_cuda_bench                                  # tessel only
//   attention_cuda_bench --torch python3                  # with the PyTorch peer
//   attention_cuda_bench --seq 1024,4096 --dim 128 --causal 1 --modes fb --rounds 5
//   attention_cuda_bench --dry-run                        # the rows it would time; no GPU needed
//
// Shapes follow FlashAttention's benchmark: --tokens per call (batch = tokens / seq) and a
// model width --hidden (heads = hidden / dim). --groups adds grouped-query rows: group g has
// heads / g key/value heads (1: multi-head; default also 4, Llama 3's ratio); PyTorch runs
// them with enable_gqa. Both sides call the user-facing entry point
// (tessel::kernels::scaled_dot_product_attention, F.scaled_dot_product_attention) with
// autograd: "fwd" is a forward without gradients, "fb" forward plus backward given the output
// gradient. Each figure is the median over --rounds rounds of --calls calls timed between two
// CUDA events after one warm-up call; the rounds alternate tessel and PyTorch so that both see
// the GPU in the same state. Before timing, the sum of each side's output is printed: the
// inputs are identical (a formula, computed exactly in f32 and rounded to bf16 on both sides),
// so the sums agree to bf16 rounding of the outputs.
//
// Convention: forward flops 4 * B * H * S^2 * D (H the query heads, whatever the group),
// halved when causal; forward + backward 3.5x.
// Where there is no CUDA device the program prints why and exits 0.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/stream.h"

#ifndef TESSEL_SOURCE_DIR
#define TESSEL_SOURCE_DIR "."
#endif

namespace {

using namespace tessel;
using kernels::SdpaBackend;

struct Flags {
  std::string seqs = "512,1024,2048,4096,8192,16384", dims = "64,128", causals = "0,1";
  std::string backends = "flash,cudnn", modes = "fwd,fb", groups = "1,4";
  bool dry_run = false;
  int64_t tokens = 16384, hidden = 2048;
  int calls = 10, rounds = 3;
  std::string device = "cuda:0";
  std::string torch = "none";
  std::string torch_script = TESSEL_SOURCE_DIR "/bench/attention_cuda/sdpa_torch_peer.py";
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The bench's inputs (sdpa_torch_peer.py computes the same): element i is
// ((i * 2654435761 + salt) mod 2^24) / 2^24 * 2 - 1, in f32, rounded to bf16 on the device.
Tensor bench_values(const Shape& shape, int64_t salt, Device device) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bits = (i * int64_t{2654435761} + salt) % (int64_t{1} << 24);
    host[i] = (static_cast<float>(bits) / static_cast<float>(1 << 24)) * 2.0f - 1.0f;
  }
  return to(to(from_vector<float>(host, shape), DType::kBF16), device);
}

struct Problem {
  int64_t b, h, s, d;
  bool causal;
  int64_t h_kv;  // key/value heads: h / the GQA group
  double flops(bool backward) const {
    const double fwd = 4.0 * b * h * s * s * d * (causal ? 0.5 : 1.0);
    return backward ? 3.5 * fwd : fwd;
  }
};

// tessel's side: inputs on the device, and calls of one backend timed between CUDA events.
class TesselSide {
 public:
  TesselSide(const Problem& p, Device device) : p_(p), device_(device) {
    const Shape shape{p.b, p.h, p.s, p.d}, kv_shape{p.b, p.h_kv, p.s, p.d};
    q_ = bench_values(shape, 1, device);
    k_ = bench_values(kv_shape, 2, device);
    v_ = bench_values(kv_shape, 3, device);
    dout_ = bench_values(shape, 4, device);
  }

  // The sum of the forward's output (f64 on the host), or the reason the backend cannot run.
  std::string output_sum(SdpaBackend backend) {
    try {
      NoGradGuard no_grad;
      const Tensor out = kernels::scaled_dot_product_attention(q_, k_, v_, options(backend)).output;
      double sum = 0;
      for (float x : to_vector<float>(to(to(out, Device::cpu()), DType::kF32))) sum += x;
      return fmt::format("{:.6g}", sum);
    } catch (const Unavailable& e) {
      return fmt::format("- ({})", e.message());
    }
  }

  // Milliseconds per call over `calls` calls, after a warm-up call the first time.
  double time_calls(SdpaBackend backend, bool backward, int calls) {
    const kernels::SdpaOptions opts = options(backend);
    auto call = [&] {
      if (!backward) {
        NoGradGuard no_grad;
        kernels::scaled_dot_product_attention(q_, k_, v_, opts);
        return;
      }
      Tensor q = detach(q_), k = detach(k_), v = detach(v_);
      q.set_requires_grad(true);
      k.set_requires_grad(true);
      v.set_requires_grad(true);
      tessel::backward(kernels::scaled_dot_product_attention(q, k, v, opts).output, dout_);
    };
    if (warm_[static_cast<int>(backend)][backward]++ == 0) call();
    Event start(device_, /*enable_timing=*/true), end(device_, /*enable_timing=*/true);
    start.record();
    for (int n = 0; n < calls; ++n) call();
    end.record();
    end.synchronize();
    return std::chrono::duration<double, std::milli>(start.elapsed(end)).count() / calls;
  }

 private:
  kernels::SdpaOptions options(SdpaBackend backend) const {
    kernels::SdpaOptions opts;
    opts.causal = p_.causal;
    opts.backend = backend;
    return opts;
  }

  Problem p_;
  Device device_;
  Tensor q_, k_, v_, dout_;
  int warm_[kernels::kSdpaBackendCount][2] = {};
};

// PyTorch's side: sdpa_torch_peer.py in a child process, one command per line (see the
// script's protocol). Not thread-safe; the destructor ends the child.
class TorchPeer {
 public:
  TorchPeer(const std::string& python, const std::string& script) {
    int to_child[2], from_child[2];
    TESSEL_CHECK(pipe(to_child) == 0 && pipe(from_child) == 0, IoError, "pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
      execlp(python.c_str(), python.c_str(), script.c_str(), nullptr);
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
    const std::string ready = pid_ > 0 ? ask("") : "";
    TESSEL_CHECK(ready.rfind("ready ", 0) == 0, Unavailable,
                 "{} {} did not start torch on the GPU (its error is above)", python, script);
    info_ = ready.substr(6);
  }
  TorchPeer(const TorchPeer&) = delete;
  TorchPeer& operator=(const TorchPeer&) = delete;
  ~TorchPeer() {
    if (to_) std::fclose(to_);  // end of input ends the script
    if (from_) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }

  // "<torch version> cuda <version> cudnn <version> <device name>".
  const std::string& info() const { return info_; }

  // The answer to one command ("" when the child is gone).
  std::string ask(const std::string& command) {
    if (!command.empty() &&
        (std::fprintf(to_, "%s\n", command.c_str()) < 0 || std::fflush(to_) != 0)) {
      return "";
    }
    char* buf = nullptr;
    size_t cap = 0;
    const ssize_t n = getline(&buf, &cap, from_);
    std::string line = n > 0 ? std::string(buf, buf[n - 1] == '\n' ? n - 1 : n) : "";
    std::free(buf);
    return line;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string info_;
};

SdpaBackend backend_named(const std::string& name) {
  if (name == "flash") return SdpaBackend::kFlashCuda;
  if (name == "cudnn") return SdpaBackend::kCudnn;
  throw InvalidArgument(fmt::format("--backends: {}; expected flash or cudnn", name));
}

std::string tflops(double flops, double ms) {
  return std::isfinite(ms) && ms > 0 ? fmt::format("{:.1f}", flops / (ms * 1e-3) / 1e12) : "-";
}

// The rows' problems, in the order they are timed.
std::vector<Problem> problems(const Flags& f) {
  std::vector<Problem> out;
  for (const std::string& seq_text : split(f.seqs)) {
    for (const std::string& dim_text : split(f.dims)) {
      for (const std::string& group_text : split(f.groups)) {
        for (const std::string& causal_text : split(f.causals)) {
          const int64_t s = std::stoll(seq_text), d = std::stoll(dim_text);
          const int64_t group = std::stoll(group_text);
          const int64_t h = std::max<int64_t>(1, f.hidden / d);
          TESSEL_CHECK(group >= 1 && h % group == 0, InvalidArgument,
                       "--groups {}: {} heads (width {} / dim {}) are not a multiple of it", group,
                       h, f.hidden, d);
          out.push_back(
              {std::max<int64_t>(1, f.tokens / s), h, s, d, causal_text == "1", h / group});
        }
      }
    }
  }
  return out;
}

int run(const Flags& f) {
  const Device device = parse_device(f.device);
  TESSEL_CHECK(device.is_cuda(), InvalidArgument, "--device {}: expected a CUDA device",
               device.str());
  const std::vector<Problem> all = problems(f);
  if (f.dry_run) {
    fmt::print("attention_cuda_bench --dry-run: {} problems x backends {} x modes {}\n", all.size(),
               f.backends, f.modes);
    for (const Problem& p : all) {
      fmt::print(
          "  S {:>6} D {:>4} B {:>4} H {:>3} H_kv {:>3} causal {}: {:.1f} / {:.1f} GFLOP "
          "(fwd / fb)\n",
          p.s, p.d, p.b, p.h, p.h_kv, p.causal ? 1 : 0, p.flops(false) / 1e9, p.flops(true) / 1e9);
    }
    return 0;
  }
  if (cuda::device_count() <= device.index) {
    fmt::print("attention_cuda_bench: skipped, no {}: {}\n", device.str(),
               cuda::device_count() == 0 ? cuda::unavailable_reason()
                                         : fmt::format("{} CUDA devices", cuda::device_count()));
    return 0;
  }
  std::unique_ptr<TorchPeer> torch;
  if (f.torch != "none") torch = std::make_unique<TorchPeer>(f.torch, f.torch_script);
  fmt::print(
      "attention_cuda_bench on {}: bf16, {} tokens per call, width {}; {} rounds of {} "
      "calls; PyTorch: {}\n",
      device.str(), f.tokens, f.hidden, f.rounds, f.calls,
      torch ? torch->info() : "not run (--torch PYTHON)");
  fmt::print("\n{:>6} {:>4} {:>4} {:>4} {:>4} {:>6} {:>6} {:>5} {:>11} {:>11} {:>9} {:>9} {:>7}\n",
             "seq", "dim", "B", "H", "H_kv", "causal", "which", "mode", "tessel ms", "torch ms",
             "tessel TF", "torch TF", "ratio");
  for (const Problem& p : all) {
    const int64_t s = p.s, d = p.d;
    TesselSide ours(p, device);
    std::string sums = "tessel";
    for (const std::string& name : split(f.backends)) {
      sums += fmt::format(" {}={}", name, ours.output_sum(backend_named(name)));
    }
    if (torch) {
      sums += "; torch " + torch->ask(fmt::format("load {} {} {} {} {} {}", p.b, p.h, p.s, p.d,
                                                  p.causal ? 1 : 0, p.h_kv));
    }
    fmt::print("# S={} D={} H_kv={} causal={}: output sums {}\n", s, d, p.h_kv, p.causal ? 1 : 0,
               sums);
    for (const std::string& name : split(f.backends)) {
      for (const std::string& mode : split(f.modes)) {
        const bool backward = mode == "fb";
        std::vector<double> mine, theirs;
        std::string note;
        for (int round = 0; round < f.rounds && note.empty(); ++round) {
          try {
            mine.push_back(ours.time_calls(backend_named(name), backward, f.calls));
          } catch (const Unavailable& e) {
            note = e.message();
          }
          if (!torch) continue;
          const std::string answer = torch->ask(fmt::format("time {} {} {}", name, mode, f.calls));
          if (answer.rfind("unsupported", 0) == 0 || answer.empty()) {
            theirs.clear();
            if (note.empty()) note = "torch: " + (answer.empty() ? "no answer" : answer);
          } else {
            theirs.push_back(std::stod(answer));
          }
        }
        const double a = median(mine), b = median(theirs);
        fmt::print(
            "{:>6} {:>4} {:>4} {:>4} {:>4} {:>6} {:>6} {:>5} {:>11} {:>11} {:>9} {:>9} {:>7}"
            "{}\n",
            s, d, p.b, p.h, p.h_kv, p.causal ? 1 : 0, name, mode,
            std::isfinite(a) ? fmt::format("{:.3f}", a) : "-",
            std::isfinite(b) ? fmt::format("{:.3f}", b) : "-", tflops(p.flops(backward), a),
            tflops(p.flops(backward), b),
            std::isfinite(a) && std::isfinite(b) ? fmt::format("{:.2f}x", b / a) : "-",
            note.empty() ? "" : "  " + note);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Fused CUDA attention: tessel's flash_cuda and cudnn beside PyTorch's"};
  app.add_option("--seq", f.seqs, "sequence lengths, comma-separated");
  app.add_option("--dim", f.dims, "head dims, comma-separated");
  app.add_option("--causal", f.causals, "0, 1 or 0,1");
  app.add_option("--backends", f.backends, "flash, cudnn (PyTorch forces the same one)");
  app.add_option("--modes", f.modes, "fwd (no gradients) and/or fb (forward + backward)");
  app.add_option("--tokens", f.tokens, "tokens per call: batch = tokens / seq");
  app.add_option("--hidden", f.hidden, "model width: heads = hidden / dim");
  app.add_option("--groups", f.groups,
                 "query heads per key/value head, comma-separated (1: multi-head; >1: GQA)");
  app.add_flag("--dry-run", f.dry_run, "print the problems and exit (no GPU needed)");
  app.add_option("--calls", f.calls, "calls timed per round");
  app.add_option("--rounds", f.rounds, "rounds, alternating tessel and PyTorch");
  app.add_option("--device", f.device, "the CUDA device");
  app.add_option("--torch", f.torch, "python with torch for the peer, or none");
  app.add_option("--torch-script", f.torch_script, "the peer script (sdpa_torch_peer.py)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "attention_cuda_bench: {}\n", e.what());
    return 1;
  }
}
