// bench/gpt_train: GPT training throughput of tessel, f32 and bf16 under AutocastGuard, beside
// PyTorch eager and torch.compile, f32 and bf16 under torch.autocast: the same model (GPT-2
// layout, tied head), the same initial weights (tessel writes them, PyTorch loads them) and the
// same batches, timed in alternating rounds of one run.
//
//   bench/gpt_train/run.sh [flags]          # builds this, then runs it with --torch auto
//   gpt_train [--layers 4] [--heads 4] [--embd 256] [--block 256] [--batch 8] [--vocab 256]
//             [--steps 4] [--rounds 5] [--warmup 8] [--threads 2] [--torch PYTHON|auto]
//             [--contenders all]
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

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "../bench_processes.h"  // torch_python
#include "../bench_train.h"
#include "tessel/nn/gpt.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;
using namespace tessel::bench;

struct Config {
  int64_t vocab = 256;
  int64_t block = 256;
  int64_t embd = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t batch = 8;
  TrainBenchOptions bench{.torch_script = TESSEL_SOURCE_DIR "/bench/gpt_train/gpt_train_torch.py"};
};

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{
      "GPT training tokens/s: tessel f32 and bf16 autocast vs PyTorch eager and "
      "torch.compile, same model, weights and data, alternating rounds"};
  app.add_option("--layers", c.layers, "transformer blocks");
  app.add_option("--heads", c.heads, "attention heads");
  app.add_option("--embd", c.embd, "embedding width");
  app.add_option("--block", c.block, "context length (tokens per sequence)");
  app.add_option("--batch", c.batch, "sequences per step");
  app.add_option("--vocab", c.vocab, "vocabulary size");
  c.bench.add_options(app);
  CLI11_PARSE(app, argc, argv);
  set_num_threads(c.bench.threads);
  c.bench.threads = num_threads();
  c.bench.torch_python = torch_python(c.bench.torch, TESSEL_SOURCE_DIR);

  const int64_t tokens = c.batch * c.block;
  const std::vector<TokenBatch> batches = make_token_batches(c.bench.batches, tokens, c.vocab);
  std::printf(
      "GPT training: %lld layers, %lld heads, embd %lld, context %lld, batch %lld, vocab "
      "%lld (%lld tokens/step); %d threads on each side\n",
      static_cast<long long>(c.layers), static_cast<long long>(c.heads),
      static_cast<long long>(c.embd), static_cast<long long>(c.block),
      static_cast<long long>(c.batch), static_cast<long long>(c.vocab),
      static_cast<long long>(tokens), c.bench.threads);
  print_cpu_training_header();

  const nn::GptConfig model{.vocab_size = c.vocab,
                            .block_size = c.block,
                            .n_layer = c.layers,
                            .n_head = c.heads,
                            .n_embd = c.embd,
                            .seed = 1};
  TesselTrainer<nn::GPT> tessel_f32(model, batches, c.batch, c.block, false);
  TesselTrainer<nn::GPT> tessel_bf16(model, batches, c.batch, c.block, true);
  TrainBenchSides sides{.name = "gpt_train",
                        .tokens_per_step = tokens,
                        .batches = &batches,
                        .tessel_f32_step = [&] { tessel_f32.step(); },
                        .tessel_bf16_step = [&] { tessel_bf16.step(); }};
  {
    NoGradGuard no_grad;
    sides.tessel_loss[0] = item(tessel_f32.loss(0));
    sides.tessel_loss[1] = item(tessel_bf16.loss(0));
  }
  sides.write_inputs = [&](const std::string& dir) {
    tessel_f32.model().save(dir + "/init.safetensors");
  };
  sides.load_command = [&](const std::string& dir) {
    std::ostringstream cmd;
    cmd << "load " << dir << " " << c.vocab << " " << c.block << " " << c.embd << " " << c.layers
        << " " << c.heads << " " << c.batch << " " << c.bench.batches;
    return cmd.str();
  };
  return run_train_bench(c.bench, sides);
}
