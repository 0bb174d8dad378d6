// bench/activation_checkpoint: peak memory and step time of a 12-layer tiny GPT trained without
// activation checkpointing, with the selective policy and with full recomputation
// (nn/activation_checkpoint.h), on the CPU in f32.
//
//   build/release/bench/activation_checkpoint
//   build/release/bench/activation_checkpoint --layers 12 --embd 128 --batch 8 --seq 256
//
// Peak: the CPU allocator's peak during one forward + backward above what was allocated before
// it (weights, gradients). Step: the median seconds of forward + backward (bench_timer.h).

#include "tessel/nn/activation_checkpoint.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "bench_timer.h"
#include "tessel/nn/gpt.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

using namespace tessel;

int main(int argc, char** argv) {
  CLI::App app("peak memory and step time with and without activation checkpointing");
  int64_t layers = 12, embd = 128, heads = 4, batch = 8, seq = 256, vocab = 256;
  app.add_option("--layers", layers, "transformer blocks");
  app.add_option("--embd", embd, "embedding width");
  app.add_option("--heads", heads, "attention heads");
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--seq", seq, "sequence length");
  CLI11_PARSE(app, argc, argv);

  Generator gen(7);
  const Tensor tokens = to(mul(rand({batch, seq}, gen), vocab - 0.01), DType::kI64);
  const Tensor targets = to(mul(rand({batch, seq}, gen), vocab - 0.01), DType::kI64);
  fmt::print("GPT: {} layers, C {}, {} heads, vocab {}, batch {} x seq {} (f32, CPU)\n", layers,
             embd, heads, vocab, batch, seq);
  fmt::print("{:<10} {:>16} {:>12} {:>10}\n", "policy", "peak act (MiB)", "step (ms)", "vs none");
  double none_ms = 0;
  for (auto policy : {nn::CheckpointPolicy::kNone, nn::CheckpointPolicy::kSelective,
                      nn::CheckpointPolicy::kFull}) {
    nn::GPT model({.vocab_size = vocab,
                   .block_size = seq,
                   .n_layer = layers,
                   .n_head = heads,
                   .n_embd = embd,
                   .seed = 1});
    nn::checkpoint_blocks(model, policy);
    auto step = [&] { backward(nn::GPT::loss(model(tokens), targets)); };
    step();  // gradients allocated
    const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
    reset_peak_memory_stats(Device::cpu());
    step();
    const double peak = (memory_stats(Device::cpu()).peak_allocated_bytes - before) / 1048576.0;
    const double ms = 1e3 * bench::median_seconds(step, 5);
    if (policy == nn::CheckpointPolicy::kNone) none_ms = ms;
    fmt::print("{:<10} {:>16.1f} {:>12.1f} {:>9.2f}x\n", nn::checkpoint_policy_name(policy), peak,
               ms, ms / none_ms);
  }
  return 0;
}
