#pragma once
// What the GPT benches on one GPU (gpt_cuda_bench, fsdp_cuda_bench) share: the model's shape and
// schedule as flags, the training loop tessel's side times, and the PyTorch peer scripts' inputs
// (token batches and initial weights written where they read them) and result line
// "torch <mode> <median seconds per step> <peak bytes> <loss>...".

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::bench {

// The model both sides train and how many steps: dropout 0, seed 1 (GPT-2 124M by default).
struct GptShape {
  int64_t batch = 16, seq = 1024, layers = 12, heads = 12, embd = 768, vocab = 50304;
  int steps = 20, warmup = 5;

  nn::GptConfig config() const {
    return {.vocab_size = vocab,
            .block_size = seq,
            .n_layer = layers,
            .n_head = heads,
            .n_embd = embd,
            .dropout = 0.0,
            .seed = 1};
  }
  // The same shape as the peer scripts' flags.
  std::string peer_flags() const {
    return fmt::format(
        "--batch {} --seq {} --layers {} --heads {} --embd {} --vocab {} "
        "--steps {} --warmup {}",
        batch, seq, layers, heads, embd, vocab, steps, warmup);
  }
  void add_options(CLI::App& app) {
    app.add_option("--batch", batch, "sequences per step");
    app.add_option("--seq", seq, "sequence length (context)");
    app.add_option("--layers", layers, "transformer blocks");
    app.add_option("--heads", heads, "attention heads");
    app.add_option("--embd", embd, "model width");
    app.add_option("--vocab", vocab, "vocabulary size");
    app.add_option("--steps", steps, "timed steps");
    app.add_option("--warmup", warmup, "untimed steps first");
  }
};

// One setup's figures.
struct GptRun {
  std::string name;
  double step_s = 0;  // median seconds per step after the warm-up
  int64_t peak_bytes = 0;
  std::vector<double> losses;
  std::string note;  // why there is no result
};

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Called as each phase of a step starts ("forward", "backward", "optimizer") and after the loss
// was read ("loss read").
using StepMarker = std::function<void(int step, std::string_view phase)>;

// tessel's side of a bench: trains `model` (on `device`) on the token batches as the peer
// scripts do — AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1), `clip` on the
// gradients, bf16 autocast with f32 parameters when `bf16` — each step ending with the loss
// read on the host. The median step after the warm-up, the peak allocated bytes, every loss.
inline GptRun train_steps(nn::GPT& model, const GptShape& s, const std::vector<int32_t>& tokens,
                          Device device, bool bf16, const std::function<void()>& clip,
                          const StepMarker& mark = {}) {
  GptRun r;
  nn::optim::AdamW opt(model.parameters(),
                       {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  synchronize(device);
  reset_peak_memory_stats(device);
  const int64_t per_step = s.batch * (s.seq + 1);
  std::vector<double> times;
  for (int step = 0; step < s.steps + s.warmup; ++step) {
    const Tensor batch =
        to(from_data(tokens.data() + step * per_step, per_step, {s.batch, s.seq + 1}, DType::kI32),
           device);
    const Stopwatch watch;
    if (mark) mark(step, "forward");
    const Tensor x = narrow(batch, 1, 0, s.seq), y = narrow(batch, 1, 1, s.seq);
    Tensor loss;
    {
      AutocastGuard autocast(DType::kBF16, bf16);
      loss = nn::GPT::loss(model(x), y);
    }
    if (mark) mark(step, "backward");
    backward(loss);
    if (mark) mark(step, "optimizer");
    clip();
    opt.step();
    opt.zero_grad();
    r.losses.push_back(item(loss));  // waits for the step
    if (mark) mark(step, "loss read");
    if (step >= s.warmup) times.push_back(watch.elapsed_seconds());
  }
  r.step_s = median_of(times);
  r.peak_bytes = memory_stats(device).peak_allocated_bytes;
  return r;
}

// `steps` batches of B x (T + 1) i32 tokens, uniform over the vocabulary (one seed).
inline std::vector<int32_t> make_tokens(const GptShape& s) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(s.vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>((s.steps + s.warmup) * s.batch * (s.seq + 1)));
  for (auto& t : tokens) t = token(rng);
  return tokens;
}

// Writes dir/tokens.i32 and dir/init.safetensors (a fresh model of `config`: tessel's initial
// weights, which the peer loads).
inline void write_peer_inputs(const std::filesystem::path& dir, const std::vector<int32_t>& tokens,
                              const nn::GptConfig& config) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / "tokens.i32", std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(int32_t)));
  nn::GPT(config).save((dir / "init.safetensors").string());
}

// Runs the peer's command line and reads its result line; other output becomes the note when
// it fails.
inline GptRun run_peer(const std::string& cmd, const std::string& name) {
  GptRun r;
  r.name = name;
  FILE* p = ::popen(cmd.c_str(), "r");
  TESSEL_CHECK(p != nullptr, IoError, "cannot start '{}'", cmd);
  char line[1 << 16];
  std::string tail;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    const std::string s(line);
    if (s.rfind("torch ", 0) != 0) {
      tail += s;
      continue;
    }
    std::istringstream in(s);
    std::string word, mode;
    in >> word >> mode >> r.step_s >> r.peak_bytes;
    double loss = 0;
    while (in >> loss) r.losses.push_back(loss);
  }
  const int status = ::pclose(p);
  if (status != 0 || r.step_s <= 0) {
    r.note = fmt::format("failed (status {}): {}", status,
                         tail.size() > 2000 ? tail.substr(tail.size() - 2000) : tail);
  }
  return r;
}

}  // namespace tessel::bench
