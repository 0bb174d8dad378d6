// gpt_cuda_bench: GPT-2 124M training on one GPU, tessel beside PyTorch (eager and
// torch.compile) with the same configuration, initial weights and token batches, in one run.
//
//   gpt_cuda_bench                                   # GPT-2 124M, bf16, B=16, T=1024
//   gpt_cuda_bench --torch python3 --torch-script bench/gpt_cuda/gpt_cuda_torch.py
//   gpt_cuda_bench --dtype f32 --tf32 --layers 2 --steps 10     # quick look
//   gpt_cuda_bench --device cpu --dtype f32 --layers 2 --embd 64 --vocab 256 --seq 64 --batch 2
//       --torch python3    # the plumbing on the CPU: the first losses of both sides agree
//
// Both sides: nanoGPT's GPT-2 (tied LM head, tanh GELU, LayerNorm eps 1e-5, biases), dropout 0,
// AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every parameter; fused
// multi-tensor), gradient clipping at 1.0; bf16 means autocast to bf16 with f32 master weights
// and optimizer state (llm.c's train_gpt2.py settings). tessel's initial weights are written to
// a safetensors file the PyTorch script loads, and the token batches (uniform over the
// vocabulary, one seed) to a file both read, so the losses of the first steps agree.
//
// Attention: whatever scaled_dot_product_attention picks for tessel on the device — with bf16
// (autocast) a fused kernel (cuDNN on Hopper, flash_cuda otherwise), with f32 the math
// backend's reference kernel, since neither fused kernel takes f32. --attention auto gives
// PyTorch F.scaled_dot_product_attention in the first case and plain attention of tensor ops
// (q k^T, masked softmax, @ v) in the second.
//
// Timing: each step ends with the loss read on the host (both sides), the step times after the
// warm-up give the median; tokens/s = B * T / median; MFU = (6 N + 12 L C T) tokens/s / peak
// (peak: --peak-tflops, else the dense bf16/TF32/f32 peak of the device by name: H100/H200,
// A100). Peak memory: the caching allocator's peak allocated bytes (PyTorch:
// torch.cuda.max_memory_allocated).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench_gpt.h"
#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/tensor/cuda/cuda.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

#ifndef TESSEL_SOURCE_DIR
#define TESSEL_SOURCE_DIR "."
#endif

namespace {

using namespace tessel;

struct Flags {
  bench::GptShape shape;  // GPT-2 124M, B=16, T=1024
  std::string dtype = "bf16";
  bool tf32 = false;
  std::string device = "cuda:0";
  std::string torch = "none";  // python with torch, or none
  std::string torch_script = TESSEL_SOURCE_DIR "/bench/gpt_cuda/gpt_cuda_torch.py";
  std::string torch_modes = "eager,compile";
  std::string attention = "auto";
  std::string work_dir;
  double peak_tflops = 0;
};

using Result = bench::GptRun;

// The device's dense peak for the dtype, by its name (0 when unknown).
double peak_flops(const std::string& name, const Flags& f) {
  const bool hopper =
      name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  const bool ampere = name.find("A100") != std::string::npos;
  if (f.dtype == "bf16") return hopper ? 989.5e12 : ampere ? 312e12 : 0;
  if (f.tf32) return hopper ? 494.7e12 : ampere ? 156e12 : 0;
  return hopper ? 66.9e12 : ampere ? 19.5e12 : 0;
}

Result run_tessel(const Flags& f, const nn::GptConfig& config, const std::vector<int32_t>& tokens,
                  Device device) {
  nn::GPT model(config);
  model.to(device);
  Result r = bench::train_steps(model, f.shape, tokens, device, f.dtype == "bf16",
                                [&] { nn::optim::clip_grad_norm(model.parameters(), 1.0); });
  r.name = "tessel";
  return r;
}

// One PyTorch mode, from its line "torch <mode> <step_s> <peak_bytes> <loss> <loss> ...".
Result run_torch(const Flags& f, const std::string& mode, const std::string& attention,
                 const std::filesystem::path& dir) {
  const std::string cmd = fmt::format(
      "PYTHONWARNINGS=ignore '{}' '{}' --mode {} --init '{}' --tokens '{}' {} --dtype {} {} "
      "--attention {} --device {} 2>&1",
      f.torch, f.torch_script, mode, (dir / "init.safetensors").string(),
      (dir / "tokens.i32").string(), f.shape.peer_flags(), f.dtype, f.tf32 ? "--tf32" : "",
      attention, f.device);
  return bench::run_peer(cmd, "torch " + mode);
}

int run(const Flags& f) {
  const Device device = parse_device(f.device);
  if (device.is_cuda() && cuda::device_count() == 0) {
    fmt::print("gpt_cuda_bench: skipped, no CUDA device: {}\n", cuda::unavailable_reason());
    return 0;
  }
  check_device_available(device);
  TESSEL_CHECK(f.dtype == "bf16" || f.dtype == "f32", InvalidArgument,
               "--dtype {}: expected bf16 or f32", f.dtype);
  cuda::set_matmul_allow_tf32(f.tf32);
  const nn::GptConfig config = f.shape.config();
  const std::filesystem::path dir = f.work_dir.empty()
                                        ? std::filesystem::temp_directory_path() / "gpt_cuda_bench"
                                        : std::filesystem::path(f.work_dir);
  const std::vector<int32_t> tokens = bench::make_tokens(f.shape);
  bench::write_peer_inputs(dir, tokens, config);

  // Which attention tessel runs here (a tiny causal problem on the device).
  const Tensor probe = zeros({1, 1, 2, f.shape.embd / f.shape.heads},
                             f.dtype == "bf16" ? DType::kBF16 : DType::kF32, device);
  kernels::SdpaOptions causal;
  causal.causal = true;
  const std::string tessel_attention(kernels::sdpa_backend_name(
      kernels::scaled_dot_product_attention(probe, probe, probe, causal).backend));
  const std::string attention = f.attention != "auto"        ? f.attention
                                : tessel_attention == "math" ? "plain"
                                                             : "sdpa";

  const std::string name = device.is_cuda() ? cuda::device_name(device.index) : "the CPU";
  nn::GPT sizer(config);
  const double n_params = static_cast<double>(sizer.num_parameters());
  const bench::GptShape& s = f.shape;
  const double flops_per_token = 6 * n_params + 12.0 * s.layers * s.embd * s.seq;
  const double peak = f.peak_tflops > 0 ? f.peak_tflops * 1e12 : peak_flops(name, f);
  fmt::print(
      "gpt_cuda_bench on {} ({}): GPT {} layers, {} heads, {} wide, context {}, vocab {} "
      "({:.1f} M parameters); batch {} x {} = {} tokens/step; {}{}; {} warm-up + {} timed "
      "steps\n",
      device.str(), name, s.layers, s.heads, s.embd, s.seq, s.vocab, n_params / 1e6, s.batch, s.seq,
      s.batch * s.seq, f.dtype == "bf16" ? "bf16 autocast" : "f32", f.tf32 ? " (TF32 matmuls)" : "",
      s.warmup, s.steps);
  fmt::print("attention: tessel {} ({}), PyTorch {}\n", tessel_attention,
             tessel_attention == "math" ? "the reference kernel, not a fused one" : "fused kernel",
             attention == "plain" ? "plain (q k^T, masked_fill, softmax, @ v)"
                                  : "F.scaled_dot_product_attention");
  std::fflush(stdout);

  std::vector<Result> results;
  try {
    results.push_back(run_tessel(f, config, tokens, device));
  } catch (const Error& e) {
    Result r;
    r.name = "tessel";
    r.note = e.what();
    results.push_back(r);
  }
  if (f.torch != "none") {
    std::stringstream modes(f.torch_modes);
    std::string mode;
    while (std::getline(modes, mode, ',')) {
      empty_cache(device);  // give the peer the memory tessel's cache holds
      results.push_back(run_torch(f, mode, attention, dir));
    }
  }

  double compiled = 0;
  for (const Result& r : results) {
    if (r.name == "torch compile" && r.step_s > 0) compiled = r.step_s;
  }
  fmt::print("\n{:<15} {:>12} {:>10} {:>7} {:>11} {:>9} {:>9} {:>12}\n", "setup", "tokens/s",
             "ms/step", "MFU", "peak mem", "loss 1", "loss end", "vs compiled");
  for (const Result& r : results) {
    if (r.step_s <= 0) {
      fmt::print("{:<15} {}\n", r.name, r.note.empty() ? "no result" : r.note);
      continue;
    }
    const double tps = static_cast<double>(s.batch * s.seq) / r.step_s;
    fmt::print("{:<15} {:>12.0f} {:>10.2f} {:>7} {:>11} {:>9.4f} {:>9.4f} {:>12}\n", r.name, tps,
               r.step_s * 1e3,
               peak > 0 ? fmt::format("{:.1f}%", 100 * flops_per_token * tps / peak) : "n/a",
               bytes_str(r.peak_bytes), r.losses.empty() ? 0.0 : r.losses.front(),
               r.losses.empty() ? 0.0 : r.losses.back(),
               compiled > 0 ? fmt::format("{:.3f}x", compiled / r.step_s) : "n/a");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"GPT-2 training on one GPU: tessel beside PyTorch eager and torch.compile"};
  f.shape.add_options(app);  // --warmup: torch.compile compiles there
  app.add_option("--dtype", f.dtype, "bf16 (autocast, f32 master weights) or f32");
  app.add_flag("--tf32", f.tf32, "f32 matmuls on TF32 tensor cores (both sides)");
  app.add_option("--device", f.device, "the CUDA device");
  app.add_option("--torch", f.torch, "python with torch for the peer, or none");
  app.add_option("--torch-script", f.torch_script, "the peer script (gpt_cuda_torch.py)");
  app.add_option("--torch-modes", f.torch_modes, "comma-separated: eager, compile");
  app.add_option("--attention", f.attention,
                 "PyTorch's attention: plain, sdpa, or auto (plain when tessel's is math)");
  app.add_option("--work-dir", f.work_dir, "where the shared weights and tokens are written");
  app.add_option("--peak-tflops", f.peak_tflops, "the device's peak for MFU (default: by name)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "gpt_cuda_bench: {}\n", e.what());
    return 1;
  }
}
