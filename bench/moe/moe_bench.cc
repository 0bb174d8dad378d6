// bench/moe: the mixture-of-experts layer's costs on the CPU.
//
//   bench/moe/run.sh [flags]       # builds this, runs it with the venv's PyTorch (--torch auto)
//   moe_bench [--tokens 2048] [--dim 64] [--hidden 32] [--experts 64] [--top-k 2] [--threads 2]
//             [--reps 7] [--torch PYTHON|auto|none]
//
// 1. kernels::grouped_matmul against a loop of per-expert matmuls (narrow, matmul, cat: one
//    autograd node per expert) on the rows of a real routing over many small groups, forward +
//    backward; equal bit for bit, then the median time of each and the loop / grouped ratio.
// 2. The nn::MoE layer (sigmoid router, top-k, grouped SwiGLU experts, combine) forward +
//    backward at ep = 1, 2 and 4 on rank threads (threads backend, one tensor thread per rank):
//    the same global tokens split over the ranks, the step's median wall time on rank 0 and
//    the part of it spent in the dispatch all-to-alls (ExpertParallel::stats), so the
//    communication shows separately from the compute. Rank threads share this machine's cores:
//    the ep rows measure the dispatch path's overhead, not a speed-up.
// 3. The same layer in PyTorch eager (moe_torch.py: the usual per-expert loop) at ep = 1, in the
//    same run, with the ratio; skipped with the reason when no PyTorch is found.
// The header prints the CPU's features and the load average.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../bench_host.h"
#include "../bench_processes.h"  // torch_python
#include "../bench_timer.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/kernels/moe/grouped_matmul.h"
#include "tessel/nn/moe.h"
#include "tessel/parallel/ep/expert_parallel.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;
using namespace tessel::bench;

struct Config {
  int64_t tokens = 2048, dim = 64, hidden = 32, experts = 64, top_k = 2;
  int threads = 2, reps = 7;
  std::string torch = "auto";
};

nn::MoEOptions moe_options(const Config& c) {
  return {.dim = c.dim,
          .hidden_dim = c.hidden,
          .num_experts = c.experts,
          .top_k = c.top_k,
          .score = nn::MoEScore::kSigmoid};
}

bool equal_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         to_vector<float>(contiguous(a)) == to_vector<float>(contiguous(b));
}

// Offsets of a routing's rows over the experts: the counts a random top-k choice gives.
std::vector<int64_t> routing_offsets(const Config& c) {
  std::mt19937_64 rng(3);
  std::vector<int64_t> counts(static_cast<size_t>(c.experts), 0);
  std::uniform_int_distribution<int64_t> pick(0, c.experts - 1);
  for (int64_t i = 0; i < c.tokens * c.top_k; ++i) ++counts[pick(rng)];
  std::vector<int64_t> offsets(1, 0);
  for (int64_t n : counts) offsets.push_back(offsets.back() + n);
  return offsets;
}

Tensor per_expert_loop(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  std::vector<Tensor> pieces;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows > 0) {
      pieces.push_back(
          matmul(narrow(x, 0, offsets[g], rows), select(w, 0, static_cast<int64_t>(g))));
    }
  }
  return cat(pieces, 0);
}

void grouped_vs_loop(const Config& c) {
  const std::vector<int64_t> offsets = routing_offsets(c);
  const int64_t M = offsets.back();
  Generator gen(1);
  Tensor x = randn({M, c.dim}, gen);
  Tensor w = randn({c.experts, c.dim, c.hidden}, gen);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  auto run = [&](bool grouped) {
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    const Tensor y =
        grouped ? kernels::grouped_matmul(x, w, offsets) : per_expert_loop(x, w, offsets);
    backward(sum(mul(y, y)));
    return y;
  };
  const Tensor y1 = detach(run(true));
  const Tensor dx1 = clone(x.grad()), dw1 = clone(w.grad());
  const Tensor y2 = detach(run(false));
  const bool equal = equal_bits(y1, y2) && equal_bits(dx1, x.grad()) && equal_bits(dw1, w.grad());
  const double grouped = median_seconds([&] { run(true); }, c.reps);
  const double loop = median_seconds([&] { run(false); }, c.reps);
  std::printf(
      "grouped matmul vs per-expert loop: %lld rows over %lld experts (%.1f rows each), K %lld, "
      "N %lld, forward + backward\n",
      static_cast<long long>(M), static_cast<long long>(c.experts),
      static_cast<double>(M) / static_cast<double>(c.experts), static_cast<long long>(c.dim),
      static_cast<long long>(c.hidden));
  std::printf("  equal bit for bit (output, dx, dw): %s\n", equal ? "yes" : "NO");
  std::printf("  grouped %8.3f ms | loop %8.3f ms | loop / grouped %.2fx\n", grouped * 1e3,
              loop * 1e3, loop / grouped);
}

struct EpFigures {
  double step_s = 0, all_to_all_s = 0;
  int64_t bytes = 0;
};

// The MoE layer forward + backward on `ep` rank threads, each with tokens / ep of the tokens.
EpFigures moe_at_ep(const Config& c, int ep) {
  EpFigures out;
  threads::run_ranks(ep, [&](ProcessGroup& pg) {
    nn::MoE moe(moe_options(c));
    std::unique_ptr<ExpertParallel> handle;
    if (ep > 1) {
      const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {ep}, {"dp_shard"});
      handle = std::make_unique<ExpertParallel>(parallelize_experts(moe, carve_ep_mesh(mesh, ep)));
    }
    Generator gen(10 + pg.rank());
    Tensor x = randn({c.tokens / ep, c.dim}, gen);
    x.set_requires_grad(true);
    auto step = [&] {
      const nn::Tensors y = moe(nn::Tensors{x});
      backward(sum(mul(y[0], y[0])));
      moe.zero_grad();
    };
    step();  // warm-up (the groups are made here)
    if (handle) handle->reset_stats();
    std::vector<double> times;
    for (int r = 0; r < c.reps; ++r) {
      pg.barrier();
      const auto start = std::chrono::steady_clock::now();
      step();
      times.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (pg.rank() == 0) {
      out.step_s = median(times);
      if (handle) {
        const ExpertParallelStats s = handle->stats();
        out.all_to_all_s = s.all_to_all_time.count() / c.reps;
        out.bytes = s.bytes_sent / c.reps;
      }
    }
  });
  return out;
}

// The PyTorch peer's median step, or a negative value with `why` set.
double torch_step(const Config& c, std::string* why) {
  const std::string python = torch_python(c.torch, TESSEL_SOURCE_DIR);
  if (c.torch == "none" || python.empty()) {
    *why = c.torch == "none" ? "--torch none" : "no PyTorch venv (scripts/torch-venv.sh failed)";
    return -1;
  }
  const std::string cmd = python + " " TESSEL_SOURCE_DIR "/bench/moe/moe_torch.py" + " --tokens " +
                          std::to_string(c.tokens) + " --dim " + std::to_string(c.dim) +
                          " --hidden " + std::to_string(c.hidden) + " --experts " +
                          std::to_string(c.experts) + " --top-k " + std::to_string(c.top_k) +
                          " --reps " + std::to_string(c.reps) + " --threads " +
                          std::to_string(c.threads) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  double seconds = -1;
  char line[512];
  while (p != nullptr && std::fgets(line, sizeof(line), p) != nullptr) {
    std::sscanf(line, "torch_eager_s %lf", &seconds);
    if (std::string(line).rfind("torch_version", 0) == 0) std::printf("  PyTorch: %s", line + 14);
  }
  if (p != nullptr) ::pclose(p);
  if (seconds < 0) *why = "the PyTorch peer printed no time (" + python + ")";
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"bench/moe: grouped matmul vs loop, the MoE layer at ep 1/2/4, PyTorch eager"};
  app.add_option("--tokens", c.tokens, "tokens per step (the global batch)");
  app.add_option("--dim", c.dim, "model width C");
  app.add_option("--hidden", c.hidden, "each expert's hidden size F");
  app.add_option("--experts", c.experts, "experts E (divisible by 4)");
  app.add_option("--top-k", c.top_k, "experts per token");
  app.add_option("--threads", c.threads, "tensor threads (the ep rows use one per rank)");
  app.add_option("--reps", c.reps, "timed repetitions (medians)");
  app.add_option("--torch", c.torch, "python with torch, auto (the venv) or none");
  CLI11_PARSE(app, argc, argv);

  std::printf("cpu: %s\nload average: %s\n",
              cpu_features({"avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"}).c_str(),
              load_average().c_str());
  set_num_threads(c.threads);
  std::printf("threads %d; tokens %lld, C %lld, F %lld, E %lld, top-%lld\n\n", c.threads,
              static_cast<long long>(c.tokens), static_cast<long long>(c.dim),
              static_cast<long long>(c.hidden), static_cast<long long>(c.experts),
              static_cast<long long>(c.top_k));
  grouped_vs_loop(c);

  std::printf("\nMoE layer forward + backward (median step on rank 0)\n");
  const EpFigures one = moe_at_ep(c, 1);
  std::printf("  ep 1, %d threads: %8.3f ms  (%.0f tokens/s)\n", c.threads, one.step_s * 1e3,
              static_cast<double>(c.tokens) / one.step_s);
  set_num_threads(1);
  for (int ep : {1, 2, 4}) {
    const EpFigures f = moe_at_ep(c, ep);
    std::printf(
        "  ep %d, rank threads x 1 thread: %8.3f ms per step, of which all-to-all %7.3f ms "
        "(%4.1f%%, %lld bytes sent)\n",
        ep, f.step_s * 1e3, f.all_to_all_s * 1e3, 100.0 * f.all_to_all_s / f.step_s,
        static_cast<long long>(f.bytes));
  }
  set_num_threads(c.threads);

  std::printf("\nPyTorch eager, the same layer (per-expert loop), %d threads\n", c.threads);
  std::string why;
  const double torch = torch_step(c, &why);
  if (torch < 0) {
    std::printf("  skipped: %s\n", why.c_str());
  } else {
    std::printf("  torch eager %8.3f ms | tessel ep 1 %8.3f ms | torch / tessel %.2fx\n",
                torch * 1e3, one.step_s * 1e3, torch / one.step_s);
  }
  return 0;
}
