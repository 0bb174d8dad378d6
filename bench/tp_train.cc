// bench_tp: GPT training throughput under tessel's tensor parallelism (gpt_tp_plan), with
// sequence parallelism and its overlapped all_gather, and composed with FSDP, beside PyTorch's
// parallelize_module with the same plan, on CPU over Gloo, same config and global batch, same
// run.
//
//   bench_tp                      # ours only
//   bench_tp --torch auto         # + PyTorch (venv from scripts/torch-venv.sh)
//   bench_tp --embd 512 --seq 512 --rounds 3 --torch auto
//
// Setups (one thread per process): tp (--tp processes), tp_sp (+ sequence parallelism),
// tp_sp_overlap (+ the all_gathers before c_attn/c_fc split in --chunks, overlapped with the
// matmul), dp_tp (FSDP over dp_shard --dp after TP over --tp: --dp * --tp processes) and fsdp
// (FSDP over --dp * --tp processes). PyTorch runs tp, dp_tp and fsdp (bench/tp/torch_tp.py).
// Tokens/s is the global batch over the median step time of rank 0; rounds alternate ours and
// PyTorch's.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench_host.h"
#include "bench_procs.h"
#include "tessel/base/clock.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;

struct Flags {
  int tp = 2, dp = 2;
  int64_t vocab = 256, seq = 256, layers = 4, heads = 4, embd = 256, batch = 8, chunks = 2;
  int steps = 6, warmup = 2, rounds = 2;
  std::string torch;
  std::vector<std::string> setups = {"tp", "tp_sp", "tp_sp_overlap", "dp_tp", "fsdp"};
};

// Seconds of each timed step (after the warm-up) of one setup on this rank.
std::vector<double> train(const Flags& f, const std::string& setup,
                          std::shared_ptr<ProcessGroup> world) {
  const nn::GptConfig config{.vocab_size = f.vocab,
                             .block_size = f.seq,
                             .n_layer = f.layers,
                             .n_head = f.heads,
                             .n_embd = f.embd,
                             .seed = 1};
  nn::GPT model(config);
  const bool fsdp_only = setup == "fsdp";
  const bool dp_tp = setup == "dp_tp";
  DeviceMesh mesh = fsdp_only ? init_device_mesh(world, {world->size()}, {"dp_shard"})
                    : dp_tp   ? init_device_mesh(world, {f.dp, f.tp}, {"dp_shard", "tp"})
                              : init_device_mesh(world, {f.tp}, {"tp"});
  if (!fsdp_only) {
    const bool sp = setup.rfind("tp_sp", 0) == 0;
    parallelize_module(model, mesh["tp"],
                       gpt_tp_plan({.sequence_parallel = sp,
                                    .overlap_chunks = setup == "tp_sp_overlap" ? f.chunks : 0}));
  }
  int64_t dp_size = 1, dp_rank = 0;
  if (fsdp_only || dp_tp) {
    const DeviceMesh dp = mesh["dp_shard"];
    for (int64_t i = 0; i < f.layers; ++i) {
      fully_shard(model.submodule("transformer.h").child(std::to_string(i)), dp);
    }
    fully_shard(model, dp);
    dp_size = dp.size();
    dp_rank = dp.local_rank();
  }
  nn::optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  Generator gen(1);
  const int64_t rows = f.batch / dp_size;
  std::vector<double> times;
  for (int step = 0; step < f.steps + f.warmup; ++step) {
    const Tensor tokens =
        to(mul(rand({f.batch, f.seq + 1}, gen), static_cast<double>(f.vocab - 1)), DType::kI64);
    const Tensor x = narrow(narrow(tokens, 1, 0, f.seq), 0, dp_rank * rows, rows);
    const Tensor y = narrow(narrow(tokens, 1, 1, f.seq), 0, dp_rank * rows, rows);
    world->barrier();
    const Stopwatch watch;
    const Tensor logits = model(x);
    backward(fsdp_only ? nn::GPT::loss(logits, y)
                       : loss_parallel_cross_entropy(logits, y, mesh["tp"], f.vocab));
    clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    if (step >= f.warmup) times.push_back(watch.elapsed_seconds());
  }
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app("GPT training under tensor parallelism (and FSDP), beside PyTorch's");
  app.add_option("--tp", f.tp, "tensor-parallel processes")->check(CLI::Range(2, 8));
  app.add_option("--dp", f.dp, "FSDP processes per tp rank for dp_tp (and --dp * --tp for fsdp)")
      ->check(CLI::Range(1, 8));
  app.add_option("--vocab", f.vocab);
  app.add_option("--seq", f.seq);
  app.add_option("--layers", f.layers);
  app.add_option("--heads", f.heads);
  app.add_option("--embd", f.embd);
  app.add_option("--batch", f.batch, "global batch (sequences)");
  app.add_option("--chunks", f.chunks, "all_gather chunks of tp_sp_overlap");
  app.add_option("--steps", f.steps, "timed steps per setup and round");
  app.add_option("--warmup", f.warmup, "untimed steps first");
  app.add_option("--rounds", f.rounds, "rounds (ours and PyTorch's alternate)");
  app.add_option("--torch", f.torch, "python with torch, or 'auto' (scripts/torch-venv.sh)");
  app.add_option("--setups", f.setups, "setups to run (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tp", "tp_sp", "tp_sp_overlap", "dp_tp", "fsdp"}));
  CLI11_PARSE(app, argc, argv);
  if (!gloo::is_available()) {
    std::printf("skipped: this build has no Gloo backend\n");
    return 0;
  }
  std::printf(
      "bench_tp: GPT %lld layers, %lld wide, %lld heads, context %lld, vocab %lld; "
      "global batch %lld; tp %d, dp %d; load %s\ncpu: %s\n",
      static_cast<long long>(f.layers), static_cast<long long>(f.embd),
      static_cast<long long>(f.heads), static_cast<long long>(f.seq),
      static_cast<long long>(f.vocab), static_cast<long long>(f.batch), f.tp, f.dp,
      bench::load_average().c_str(),
      bench::cpu_features({"avx512f", "avx512_bf16", "amx_tile"}).c_str());
  const std::string python = bench::torch_python(f.torch, TESSEL_SOURCE_DIR);
  const std::vector<std::string>& setups = f.setups;
  std::string torch_setups;  // those PyTorch has
  for (const std::string& s : setups) {
    if (s == "tp" || s == "dp_tp" || s == "fsdp")
      torch_setups += (torch_setups.empty() ? "" : ",") + s;
  }
  std::map<std::string, std::vector<double>> ours, theirs;
  std::string version;
  for (int round = 0; round < f.rounds; ++round) {
    for (const std::string& s : setups) {
      const int np = s.rfind("tp", 0) == 0 ? f.tp : f.dp * f.tp;
      ours[s].push_back(bench::run_forked(np, s, [&](int, std::shared_ptr<ProcessGroup> pg) {
        set_num_threads(1);
        return bench::median(train(f, s, std::move(pg)));
      }));
    }
    if (!python.empty() && !torch_setups.empty()) {
      const std::string cmd = fmt::format(
          "PYTHONWARNINGS=ignore '{}' '{}/bench/tp/torch_tp.py' --tp {} --dp {} --vocab {} "
          "--seq {} --layers {} --heads {} --embd {} --batch {} --steps {} --warmup {} "
          "--setups {} 2>/dev/null",
          python, TESSEL_SOURCE_DIR, f.tp, f.dp, f.vocab, f.seq, f.layers, f.heads, f.embd, f.batch,
          f.steps, f.warmup, torch_setups);
      for (auto& [s, seconds] : bench::run_peer(cmd, &version)) theirs[s].push_back(seconds);
    }
  }
  const bool with_torch = !theirs.empty();
  std::printf("torch: %s\n\n", with_torch ? ("PyTorch " + version).c_str()
                                          : "skipped (give --torch PYTHON or --torch auto)");
  const double tokens = static_cast<double>(f.batch * f.seq);
  std::printf("%-14s %5s %12s %10s", "setup", "procs", "ours tok/s", "ms/step");
  if (with_torch) std::printf(" %12s %10s %10s", "torch tok/s", "ms/step", "ours/torch");
  std::printf("\n");
  for (const std::string& s : setups) {
    const double o = bench::median(ours[s]);
    std::printf("%-14s %5d %12.0f %10.1f", s.c_str(), s.rfind("tp", 0) == 0 ? f.tp : f.dp * f.tp,
                o > 0 ? tokens / o : 0, o * 1e3);
    if (with_torch && !theirs[s].empty()) {
      const double t = bench::median(theirs[s]);
      std::printf(" %12.0f %10.1f %10.2f", tokens / t, t * 1e3, t / o);
    }
    std::printf("\n");
  }
  // The spread: on a shared machine a round can be far from the median.
  std::printf("\nms/step by round (ours | torch):\n");
  for (const std::string& s : setups) {
    std::string line;
    for (double v : ours[s]) line += fmt::format(" {:.0f}", v * 1e3);
    if (!theirs[s].empty()) line += " |";
    for (double v : theirs[s]) line += fmt::format(" {:.0f}", v * 1e3);
    std::printf("  %-14s%s\n", s.c_str(), line.c_str());
  }
  const double sp = bench::median(ours["tp_sp"]), overlap = bench::median(ours["tp_sp_overlap"]);
  if (sp > 0 && overlap > 0) {
    std::printf(
        "sequence-parallel all_gather overlap (%lld chunks): %.1f ms/step, %+.1f%% vs "
        "unsplit\n",
        static_cast<long long>(f.chunks), overlap * 1e3, (sp / overlap - 1) * 100);
  }
  const double dp_tp = bench::median(ours["dp_tp"]), fsdp = bench::median(ours["fsdp"]);
  if (dp_tp > 0 && fsdp > 0) {
    std::printf("dp %d x tp %d vs %d-way FSDP: %.2fx the tokens/s\n", f.dp, f.tp, f.dp * f.tp,
                fsdp / dp_tp);
  }
  return 0;
}
