// cp_bench: context parallelism on the CPU over Gloo (forked processes, one thread each), for
// one fixed global sequence:
//   attn   causal attention forward + backward (B 1, --heads heads, --attn-seq tokens, D 64) as
//          load-balanced ring attention at cp = 1, 2, 4: ms per call on rank 0 and the time it
//          waited for K/V (exposed);
//   train  a long-sequence GPT's training step (--seq tokens, FSDP over the cp ranks): tokens/s.
// Beside PyTorch at cp = 1 with the same global sequence (bench/context_parallel/cp_torch.py:
// F.scaled_dot_product_attention and the same GPT, one thread): PyTorch's context_parallel
// (torch.distributed.tensor.experimental) does not run on the CPU (2.15: no sharding strategy
// for aten._scaled_dot_product_flash_attention_for_cpu).
//
//   bench/context_parallel/run.sh                     # + PyTorch (scripts/torch-venv.sh)
//   build/release/bench/cp_bench --torch PYTHON --attn-seq 8192 --reps 3

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "../bench_host.h"
#include "../bench_procs.h"
#include "tessel/base/clock.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/cp/gpt_cp.h"
#include "tessel/parallel/cp/ring_attention.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;

struct Flags {
  int64_t heads = 8, attn_seq = 4096;
  int64_t seq = 2048, layers = 2, embd = 128, train_heads = 4, vocab = 256, batch = 1;
  int reps = 3, steps = 3, rounds = 1;
  std::vector<int> cps = {1, 2, 4};
  std::string torch;
};

// Median seconds of one ring-attention forward + backward on this rank; *exposed the median
// seconds it waited for transfers (forward and backward).
double attention(const Flags& f, ProcessGroup& pg, double* exposed) {
  const int cp = pg.size();
  const parallel::CpLayout layout = parallel::cp_layout_load_balanced(f.attn_seq, cp);
  const int64_t local = layout.local_len(pg.rank());
  Generator gen(1 + pg.rank());
  std::vector<double> times, waits;
  for (int rep = 0; rep < f.reps + 1; ++rep) {
    Tensor q = randn({1, f.heads, local, 64}, gen), k = randn({1, f.heads, local, 64}, gen);
    Tensor v = randn({1, f.heads, local, 64}, gen);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    pg.barrier();
    const Stopwatch watch;
    const parallel::RingAttentionOutput r = parallel::ring_attention(
        pg, q, k, v, layout, {.causal = true, .algorithm = parallel::CpAttentionAlgorithm::kRing});
    backward(sum(r.output));
    if (rep == 0) continue;  // warm-up
    times.push_back(watch.elapsed_seconds());
    waits.push_back(
        std::chrono::duration<double>(r.stats.exposed_wait + r.backward_stats->exposed_wait)
            .count());
  }
  *exposed = bench::median(waits);
  return bench::median(times);
}

// Median seconds of one GPT training step at cp = the world size (FSDP over it).
double train(const Flags& f, std::shared_ptr<ProcessGroup> world) {
  const int cp = world->size();
  const nn::GptConfig config{.vocab_size = f.vocab,
                             .block_size = f.seq,
                             .n_layer = f.layers,
                             .n_head = f.train_heads,
                             .n_embd = f.embd,
                             .seed = 1};
  nn::GPT model(config);
  const DeviceMesh mesh = init_device_mesh(world, {cp}, {"cp"});
  const parallel::CpLayout layout = parallel::cp_layout_load_balanced(f.seq, cp);
  if (cp > 1) {
    parallel::apply_gpt_context_parallel(model, mesh.group("cp"), layout);
    for (int64_t i = 0; i < f.layers; ++i) {
      fully_shard(model.submodule("transformer.h").child(std::to_string(i)), mesh);
    }
    fully_shard(model, mesh);
  }
  nn::optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  Generator gen(1);
  std::vector<double> times;
  for (int step = 0; step < f.steps + 1; ++step) {
    const Tensor tokens =
        to(mul(rand({f.batch, f.seq + 1}, gen), static_cast<double>(f.vocab - 1)), DType::kI64);
    const parallel::CpBatch b = parallel::cp_shard_batch(
        narrow(tokens, 1, 0, f.seq), narrow(tokens, 1, 1, f.seq), layout, world->rank());
    world->barrier();
    const Stopwatch watch;
    backward(mul(nn::GPT::loss(model(b.tokens), b.targets), b.loss_scale));
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    if (step > 0) times.push_back(watch.elapsed_seconds());
  }
  return bench::median(times);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app(
      "Context parallelism: ring attention and GPT training at cp 1, 2, 4, beside "
      "PyTorch at cp 1");
  app.add_option("--heads", f.heads, "attention heads (attn)");
  app.add_option("--attn-seq", f.attn_seq, "global sequence of the attention measurement");
  app.add_option("--seq", f.seq, "global sequence of the GPT (train)");
  app.add_option("--layers", f.layers);
  app.add_option("--embd", f.embd);
  app.add_option("--train-heads", f.train_heads);
  app.add_option("--batch", f.batch, "sequences per step (train)");
  app.add_option("--reps", f.reps, "timed attention calls");
  app.add_option("--steps", f.steps, "timed training steps");
  app.add_option("--cp", f.cps, "cp degrees (comma-separated)")->delimiter(',');
  app.add_option("--torch", f.torch, "python with torch, or 'auto' (scripts/torch-venv.sh)");
  CLI11_PARSE(app, argc, argv);
  if (!gloo::is_available()) {
    std::printf("skipped: this build has no Gloo backend\n");
    return 0;
  }
  std::printf(
      "cp_bench: attention B 1, %lld heads, S %lld, D 64, causal; GPT %lld layers, %lld wide, "
      "%lld heads, S %lld, batch %lld; one thread per process; load %s\ncpu: %s\n",
      static_cast<long long>(f.heads), static_cast<long long>(f.attn_seq),
      static_cast<long long>(f.layers), static_cast<long long>(f.embd),
      static_cast<long long>(f.train_heads), static_cast<long long>(f.seq),
      static_cast<long long>(f.batch), bench::load_average().c_str(),
      bench::cpu_features({"avx2", "avx512f", "avx512_bf16", "amx_tile"}).c_str());
  std::map<int, double> attn, step;
  for (int cp : f.cps) {
    const std::string tag = fmt::format("cp{}", cp);
    attn[cp] =
        bench::run_forked(cp, "attn-" + tag, [&](int rank, std::shared_ptr<ProcessGroup> pg) {
          set_num_threads(1);
          double wait = 0;
          const double s = attention(f, *pg, &wait);
          if (rank == 0) {  // the fork returns one number: the wait goes to stdout
            std::printf("attn cp %d: rank 0 waited %.1f ms of %.1f ms for K/V and dK/dV\n", cp,
                        wait * 1e3, s * 1e3);
            std::fflush(stdout);
          }
          return s;
        });
    step[cp] = bench::run_forked(cp, "train-" + tag, [&](int, std::shared_ptr<ProcessGroup> pg) {
      set_num_threads(1);
      return train(f, std::move(pg));
    });
  }
  std::map<std::string, double> theirs;
  std::string version;
  const std::string python = bench::torch_python(f.torch, TESSEL_SOURCE_DIR);
  if (!python.empty()) {
    theirs = bench::run_peer(
        fmt::format("PYTHONWARNINGS=ignore '{}' '{}/bench/context_parallel/cp_torch.py' --heads {} "
                    "--attn-seq {} --seq {} --layers {} --embd {} --train-heads {} --vocab {} "
                    "--batch {} --reps {} --steps {} 2>/dev/null",
                    python, TESSEL_SOURCE_DIR, f.heads, f.attn_seq, f.seq, f.layers, f.embd,
                    f.train_heads, f.vocab, f.batch, f.reps, f.steps),
        &version);
  }
  std::printf("torch: %s\n\n", theirs.empty() ? "skipped (give --torch PYTHON or --torch auto)"
                                              : ("PyTorch " + version + ", cp 1").c_str());
  std::printf("%-6s %4s %14s %14s %12s\n", "what", "cp", "ours ms", "torch cp1 ms", "torch/ours");
  for (int cp : f.cps) {
    std::printf("%-6s %4d %14.1f", "attn", cp, attn[cp] * 1e3);
    if (theirs.count("attn")) {
      std::printf(" %14.1f %12.2f", theirs["attn"] * 1e3, theirs["attn"] / attn[cp]);
    }
    std::printf("\n");
  }
  const double tokens = static_cast<double>(f.batch * f.seq);
  std::printf("\n%-6s %4s %14s %12s %14s %12s\n", "what", "cp", "ours tok/s", "ms/step",
              "torch tok/s", "ours/torch");
  for (int cp : f.cps) {
    std::printf("%-6s %4d %14.0f %12.1f", "train", cp, tokens / step[cp], step[cp] * 1e3);
    if (theirs.count("train")) {
      std::printf(" %14.0f %12.2f", tokens / theirs["train"], theirs["train"] / step[cp]);
    }
    std::printf("\n");
  }
  std::printf(
      "\ncp ranks are processes on this machine's cores: at cp > cores they share them, so the "
      "per-call time shows the work per rank only where cp <= cores.\n");
  return 0;
}
