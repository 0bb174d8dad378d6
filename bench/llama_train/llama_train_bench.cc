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

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../bench_processes.h"  // torch_python
#include "../bench_train.h"
#include "tessel/kernels/llama/rope.h"
#include "tessel/nn/llama.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;
using namespace tessel::bench;

struct Config {
  nn::LlamaConfig model = nn::LlamaConfig::tiny();
  int64_t block = 256;
  int64_t batch = 8;
  TrainBenchOptions bench{.torch_script =
                              TESSEL_SOURCE_DIR "/bench/llama_train/llama_train_torch.py"};
};

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
  c.bench.add_options(app);
  CLI11_PARSE(app, argc, argv);
  c.model.max_seq_len = std::max(c.model.max_seq_len, c.block);
  c.model.seed = 1;
  set_num_threads(c.bench.threads);
  c.bench.threads = num_threads();
  c.bench.torch_python = torch_python(c.bench.torch, TESSEL_SOURCE_DIR);

  const int64_t tokens = c.batch * c.block;
  const std::vector<TokenBatch> batches =
      make_token_batches(c.bench.batches, tokens, c.model.vocab_size);
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
      static_cast<long long>(tokens), static_cast<long long>(m.num_parameters()), c.bench.threads);
  print_cpu_training_header();

  TesselTrainer<nn::Llama> tessel_f32(m, batches, c.batch, c.block, false);
  TesselTrainer<nn::Llama> tessel_bf16(m, batches, c.batch, c.block, true);
  TrainBenchSides sides{.name = "llama_train",
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
    // The RoPE frequencies as tessel computes them (Llama 3 scaling included), raw f32.
    const Tensor inv_freq = kernels::rope_inv_freq(m.head_size(), m.rope_theta, m.rope_scaling);
    std::ofstream freq(dir + "/inv_freq.bin", std::ios::binary);
    freq.write(static_cast<const char*>(inv_freq.data_ptr()), inv_freq.numel() * 4);
  };
  sides.load_command = [&](const std::string& dir) {
    std::ostringstream cmd;
    cmd << "load " << dir << " " << m.vocab_size << " " << m.dim << " " << m.n_layers << " "
        << m.n_heads << " " << m.kv_heads() << " " << m.head_size() << " " << m.ffn_hidden() << " "
        << (m.tie_word_embeddings ? 1 : 0) << " " << m.norm_eps << " " << c.block << " " << c.batch
        << " " << c.bench.batches;
    return cmd.str();
  };
  return run_train_bench(c.bench, sides);
}
