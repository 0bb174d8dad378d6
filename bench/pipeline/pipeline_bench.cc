// bench_pipeline: GPT training throughput under tessel's pipeline runtime (parallel/pp) beside
// PyTorch's torch.distributed.pipelining, on CPU over Gloo, one stage per process, the same
// model sizes, schedules (GPipe and 1F1B), micro-batches and global batch, in the same run.
//
//   bench/pipeline/run.sh                                  # builds this, --torch auto
//   bench_pipeline [--pp 4] [--microbatches 8] [--layers 4] [--embd 128] [--seq 128]
//                  [--batch 16] [--steps 6] [--warmup 2] [--rounds 1] [--torch PYTHON|auto]
//
// Both sides: the GPT (tessel's nn::GPT layout) cut uniformly into --pp stages (embeddings on
// the first, ln_f and the head on the last), cross-entropy on the last stage, AdamW on every
// stage, one thread per process. tessel's head is tied to the embedding (its gradient summed
// over the first and last stage at STEP, an extra all_reduce); PyTorch's is untied (a
// parameter cannot span its stages). Tokens/s is the global batch over rank 0's median step.
//
// Per-stage overhead per micro-batch: each rank's median step time divided by the micro-batches
// (compute, waiting and the framework's host work per micro-batch on that stage), for both; and
// for tessel the host time per action by kind (from one action's start to the next's; a
// receive includes its wait, a send only its issue: sends are asynchronous), which shows where
// the host time goes.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../bench_host.h"
#include "../bench_procs.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/pp/gpt_stage.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;
using Clock = std::chrono::steady_clock;

struct Flags {
  int pp = 4;
  int microbatches = 8;
  int64_t vocab = 256, seq = 128, layers = 4, heads = 4, embd = 128, batch = 16;
  int steps = 6, warmup = 2, rounds = 1;
  std::vector<std::string> schedules = {"gpipe", "1f1b"};
  std::string torch;
};

// The kinds an action's host time is reported by.
const char* kind_name(pp::ActionKind k) {
  switch (k) {
    case pp::ActionKind::kForward:
      return "F";
    case pp::ActionKind::kBackward:
    case pp::ActionKind::kBackwardInput:
    case pp::ActionKind::kBackwardWeight:
      return "B";
    case pp::ActionKind::kSendActivation:
    case pp::ActionKind::kSendGradient:
      return "SEND";
    case pp::ActionKind::kRecvActivation:
    case pp::ActionKind::kRecvGradient:
      return "RECV";
    default:
      return "STEP";
  }
}

// Step `i`'s tokens and targets: a fixed pseudo-random sequence, the same on every rank.
std::pair<Tensor, Tensor> batch(const Flags& f, int i) {
  std::vector<int64_t> x, y;
  uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  for (int64_t b = 0; b < f.batch; ++b) {
    std::vector<int64_t> row;
    for (int64_t t = 0; t <= f.seq; ++t) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      row.push_back(static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(f.vocab)));
    }
    x.insert(x.end(), row.begin(), row.end() - 1);
    y.insert(y.end(), row.begin() + 1, row.end());
  }
  return {from_vector<int64_t>(x, {f.batch, f.seq}), from_vector<int64_t>(y, {f.batch, f.seq})};
}

// One process's run: the median step, and its host time per action kind (mean microseconds over
// the timed steps). Written to `out` as "step <s>" and "<kind> <us> <count>" lines.
void run_rank(const Flags& f, const std::string& schedule_name, int rank,
              std::shared_ptr<ProcessGroup> pg, const std::string& out) {
  set_num_threads(1);
  const nn::GptConfig cfg{.vocab_size = f.vocab,
                          .block_size = f.seq,
                          .n_layer = f.layers,
                          .n_head = f.heads,
                          .n_embd = f.embd,
                          .seed = 1};
  std::vector<pp::LocalStage> local;
  for (auto& s : pp::make_gpt_stages(cfg, pp::uniform_layout(cfg.n_layer, f.pp), rank, f.pp)) {
    local.push_back({s->stage(), s});
  }
  std::map<std::string, std::pair<double, int64_t>> per_kind;  // seconds, count
  bool timing = false;
  Clock::time_point last{};
  const char* last_kind = nullptr;
  auto close_action = [&](Clock::time_point now) {
    if (timing && last_kind != nullptr) {
      auto& [seconds, count] = per_kind[last_kind];
      seconds += std::chrono::duration<double>(now - last).count();
      ++count;
    }
    last_kind = nullptr;
  };
  nn::optim::AdamW* opt = nullptr;
  pp::PipelineRuntime runtime(pg, pp::make_schedule(schedule_name, f.pp, f.microbatches), local,
                              nn::GPT::loss,
                              {.on_step = [&] { opt->step(); },
                               .tied_parameters = pp::gpt_tied_parameters(),
                               .before_action =
                                   [&](const pp::Action& a) {
                                     const auto now = Clock::now();
                                     close_action(now);
                                     last = now;
                                     last_kind = kind_name(a.kind);
                                     return true;
                                   }});
  nn::optim::AdamW adamw(runtime.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  opt = &adamw;
  std::vector<double> times;
  for (int i = 0; i < f.warmup + f.steps; ++i) {
    auto [x, y] = batch(f, i);
    pg->barrier();
    timing = i >= f.warmup;
    const auto start = Clock::now();
    runtime.step(x, y);
    close_action(Clock::now());
    if (timing) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::ofstream o(out);
  o << "step " << bench::median(times) << "\n";
  for (const auto& [kind, v] : per_kind) {
    o << kind << " " << v.first / static_cast<double>(v.second) * 1e6 << " " << v.second << "\n";
  }
}

struct RankFigures {
  double step = 0;
  std::map<std::string, double> us_per_action;
};

RankFigures read_rank(const std::string& path) {
  RankFigures r;
  std::ifstream in(path);
  std::string key;
  double value = 0;
  int64_t count = 0;
  in >> key >> r.step;
  while (in >> key >> value >> count) r.us_per_action[key] = value;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app("GPT training under tessel's pipeline runtime, beside torch.distributed.pipelining");
  app.add_option("--pp", f.pp, "pipeline stages (one process each)")->check(CLI::Range(2, 8));
  app.add_option("--microbatches", f.microbatches, "micro-batches per step");
  app.add_option("--vocab", f.vocab);
  app.add_option("--seq", f.seq);
  app.add_option("--layers", f.layers, "transformer blocks (a multiple of --pp)");
  app.add_option("--heads", f.heads);
  app.add_option("--embd", f.embd);
  app.add_option("--batch", f.batch, "global batch (sequences; a multiple of --microbatches)");
  app.add_option("--steps", f.steps, "timed steps per schedule and round");
  app.add_option("--warmup", f.warmup, "untimed steps first");
  app.add_option("--rounds", f.rounds, "rounds (ours and PyTorch's alternate)");
  app.add_option("--schedules", f.schedules, "schedules (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--torch", f.torch, "python with torch, or 'auto' (scripts/torch-venv.sh)");
  CLI11_PARSE(app, argc, argv);
  if (f.layers % f.pp != 0 || f.batch % f.microbatches != 0) {
    std::fprintf(stderr,
                 "bench_pipeline: --layers %lld must divide by --pp %d and --batch %lld "
                 "by --microbatches %d\n",
                 static_cast<long long>(f.layers), f.pp, static_cast<long long>(f.batch),
                 f.microbatches);
    return 2;
  }
  if (!gloo::is_available()) {
    std::printf("skipped: this build has no Gloo backend\n");
    return 0;
  }
  std::printf(
      "bench_pipeline: GPT %lld layers, %lld wide, %lld heads, context %lld, vocab %lld; "
      "global batch %lld in %d micro-batches; pp %d (one process and thread each, Gloo); load "
      "%s\ncpu: %s\n",
      static_cast<long long>(f.layers), static_cast<long long>(f.embd),
      static_cast<long long>(f.heads), static_cast<long long>(f.seq),
      static_cast<long long>(f.vocab), static_cast<long long>(f.batch), f.microbatches, f.pp,
      bench::load_average().c_str(),
      bench::cpu_features({"avx2", "avx512f", "avx512_bf16", "amx_tile"}).c_str());
  const std::string python = bench::torch_python(f.torch, TESSEL_SOURCE_DIR);
  const std::string dir =
      std::filesystem::temp_directory_path() / fmt::format("tessel-bench-pipeline-{}", ::getpid());
  std::filesystem::create_directories(dir);

  std::map<std::string, std::vector<std::vector<RankFigures>>> ours;  // schedule -> rounds
  std::map<std::string, std::vector<double>> theirs;
  std::map<std::string, std::vector<double>> theirs_stage;  // "<schedule> <stage>" -> s/mb
  std::string version;
  std::string torch_skip = python.empty() ? "no PyTorch (give --torch PYTHON or --torch auto)" : "";
  for (int round = 0; round < f.rounds; ++round) {
    for (const std::string& s : f.schedules) {
      const double ok = bench::run_forked(f.pp, "pp-" + s, [&](int rank, auto pg) {
        run_rank(f, s, rank, std::move(pg), fmt::format("{}/{}.{}", dir, s, rank));
        return 1.0;
      });
      if (ok == 0) {
        std::printf("tessel %s failed\n", s.c_str());
        return 1;
      }
      std::vector<RankFigures> ranks;
      for (int r = 0; r < f.pp; ++r) ranks.push_back(read_rank(fmt::format("{}/{}.{}", dir, s, r)));
      ours[s].push_back(std::move(ranks));
    }
    if (!python.empty()) {
      std::string schedules;
      for (const std::string& s : f.schedules) schedules += (schedules.empty() ? "" : ",") + s;
      const std::string cmd = fmt::format(
          "PYTHONWARNINGS=ignore '{}' '{}/bench/pipeline/torch_pipeline.py' --pp {} "
          "--microbatches {} --vocab {} --seq {} --layers {} --heads {} --embd {} --batch {} "
          "--steps {} --warmup {} --schedules {} 2>/dev/null",
          python, TESSEL_SOURCE_DIR, f.pp, f.microbatches, f.vocab, f.seq, f.layers, f.heads,
          f.embd, f.batch, f.steps, f.warmup, schedules);
      FILE* p = ::popen(cmd.c_str(), "r");
      char line[512];
      while (p != nullptr && std::fgets(line, sizeof(line), p) != nullptr) {
        char name[64];
        int stage = 0;
        double a = 0, b = 0;
        if (std::sscanf(line, "torch_stage %63s %d %lf", name, &stage, &a) == 3) {
          theirs_stage[fmt::format("{} {}", name, stage)].push_back(a);
        } else if (std::sscanf(line, "torch %63s %lf %lf", name, &a, &b) == 3) {
          theirs[name].push_back(b);
        } else if (std::string(line).rfind("torch ", 0) == 0) {
          version = std::string(line + 6);
          while (!version.empty() && version.back() == '\n') version.pop_back();
        }
      }
      if (p != nullptr) ::pclose(p);
      if (theirs.empty()) {
        torch_skip = "torch.distributed.pipelining did not run (" + python + ")";
      }
    }
  }
  std::filesystem::remove_all(dir);
  const bool with_torch = !theirs.empty();
  std::printf("torch: %s\n\n", with_torch ? ("PyTorch " + version).c_str() : torch_skip.c_str());

  const double tokens = static_cast<double>(f.batch * f.seq);
  std::printf("%-8s %12s %10s", "schedule", "ours tok/s", "ms/step");
  if (with_torch) std::printf(" %12s %10s %10s", "torch tok/s", "ms/step", "ours/torch");
  std::printf("\n");
  auto step_of = [&](const std::string& s, int r) {
    std::vector<double> v;
    for (const auto& round : ours[s]) v.push_back(round[static_cast<size_t>(r)].step);
    return bench::median(v);
  };
  for (const std::string& s : f.schedules) {
    const double o = step_of(s, 0);
    std::printf("%-8s %12.0f %10.1f", s.c_str(), tokens / o, o * 1e3);
    if (with_torch && !theirs[s].empty()) {
      const double t = bench::median(theirs[s]);
      std::printf(" %12.0f %10.1f %10.2f", tokens / t, t * 1e3, t / o);
    }
    std::printf("\n");
  }
  std::printf(
      "\nper stage, ms per micro-batch (ours | torch) and ours' host us per action "
      "(F, B, SEND issue, RECV incl. wait, STEP):\n");
  for (const std::string& s : f.schedules) {
    for (int r = 0; r < f.pp; ++r) {
      std::printf("  %-6s stage %d: %7.2f", s.c_str(), r, step_of(s, r) / f.microbatches * 1e3);
      const auto it = theirs_stage.find(fmt::format("{} {}", s, r));
      if (it != theirs_stage.end()) std::printf(" | %7.2f", bench::median(it->second) * 1e3);
      std::string kinds;
      for (const auto& [kind, us] : ours[s].back()[static_cast<size_t>(r)].us_per_action) {
        kinds += fmt::format("  {} {:.0f}", kind, us);
      }
      std::printf("   %s\n", kinds.c_str());
    }
  }
  return 0;
}
