// bench/nn_train: the optimizer step and training throughput of examples/train_gpt's model.
//
//   build/rel/bench/nn_train                 # short default run
//   build/rel/bench/nn_train --layers 4 --embd 128 --steps 20 --adamw-embd 512
//
// Table 1: training tokens/s of examples/train_gpt's default model (forward, backward, clip and
// AdamW step timed apart), on one thread and on all threads, with the speed-up.
// Table 2: one AdamW step over the parameter shapes of a larger GPT, fused multi-tensor kernel
// (tessel's) against the unfused per-parameter loop (PyTorch's single-tensor for-loop
// algorithm: one pass over memory per elementary op), measured in the same run.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/tensor.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using tessel::Shape;
using tessel::Tensor;
using Clock = std::chrono::steady_clock;

struct Config {
  // The training model: examples/train_gpt's defaults.
  int64_t vocab = 256;
  int64_t block = 64;
  int64_t embd = 96;
  int64_t layers = 3;
  int64_t heads = 4;
  int64_t batch = 16;
  int64_t steps = 10;
  // The AdamW comparison's model.
  int64_t adamw_embd = 256;
  int64_t adamw_layers = 4;
  int reps = 10;
  int threads = 0;
};

// The GPT-2 layout's parameter shapes (token/position embeddings, per block two norms, qkv,
// attention projection, MLP up/down with biases, final norm; the LM head is tied).
std::vector<Shape> gpt_shapes(const Config& c) {
  const int64_t C = c.embd;
  std::vector<Shape> shapes = {{c.vocab, C}, {c.block, C}};
  for (int64_t l = 0; l < c.layers; ++l) {
    for (const Shape& s : std::vector<Shape>{{C},
                                             {C},
                                             {3 * C, C},
                                             {3 * C},
                                             {C, C},
                                             {C},
                                             {C},
                                             {C},
                                             {4 * C, C},
                                             {4 * C},
                                             {C, 4 * C},
                                             {C}}) {
      shapes.push_back(s);
    }
  }
  shapes.push_back({C});
  shapes.push_back({C});
  return shapes;
}

struct ParamSet {
  std::vector<Tensor> params, grads, exp_avg, exp_avg_sq;
  int64_t numel = 0;
};

ParamSet make_params(const std::vector<Shape>& shapes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  ParamSet set;
  for (const Shape& s : shapes) {
    Tensor p = tessel::empty(s), g = tessel::empty(s);
    for (int64_t i = 0; i < p.numel(); ++i) {
      p.data<float>()[i] = dist(rng);
      g.data<float>()[i] = dist(rng);
    }
    p.set_requires_grad(true);
    p.set_grad(g);
    set.params.push_back(p);
    set.grads.push_back(g);
    set.exp_avg.push_back(tessel::zeros(s));
    set.exp_avg_sq.push_back(tessel::zeros(s));
    set.numel += p.numel();
  }
  return set;
}

// PyTorch's single-tensor AdamW, one elementary op (one pass over memory) at a time:
//   p.mul_(1 - lr*wd); m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2)
//   denom = (v.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(m, denom, -lr/bc1)
void unfused_adamw_step(ParamSet& set, const tessel::nn::optim::AdamWOptions& o, int64_t step) {
  const float lr = static_cast<float>(o.lr), b1 = static_cast<float>(o.beta1),
              b2 = static_cast<float>(o.beta2), eps = static_cast<float>(o.eps);
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(step));
  const float sqrt_bc2 = std::sqrt(1.0f - std::pow(b2, static_cast<float>(step)));
  for (size_t t = 0; t < set.params.size(); ++t) {
    float* p = set.params[t].data<float>();
    const float* g = set.grads[t].data<float>();
    float* m = set.exp_avg[t].data<float>();
    float* v = set.exp_avg_sq[t].data<float>();
    const int64_t n = set.params[t].numel();
    std::vector<float> denom(n);
    for (int64_t i = 0; i < n; ++i) p[i] *= 1.0f - lr * static_cast<float>(o.weight_decay);
    for (int64_t i = 0; i < n; ++i) m[i] += (1.0f - b1) * (g[i] - m[i]);
    for (int64_t i = 0; i < n; ++i) v[i] *= b2;
    for (int64_t i = 0; i < n; ++i) v[i] += (1.0f - b2) * g[i] * g[i];
    for (int64_t i = 0; i < n; ++i) denom[i] = std::sqrt(v[i]);
    for (int64_t i = 0; i < n; ++i) denom[i] = denom[i] / sqrt_bc2 + eps;
    for (int64_t i = 0; i < n; ++i) p[i] += -lr / bc1 * m[i] / denom[i];
  }
}

template <typename Fn>
double median_ms(int reps, Fn&& fn) {
  fn();  // warm-up
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void bench_adamw(Config c) {
  c.embd = c.adamw_embd;
  c.layers = c.adamw_layers;
  c.block = 1024;
  const std::vector<Shape> shapes = gpt_shapes(c);
  const tessel::nn::optim::AdamWOptions o{.lr = 3e-4, .weight_decay = 0.1};
  const int threads =
      c.threads > 0 ? c.threads : static_cast<int>(std::thread::hardware_concurrency());
  ParamSet reference = make_params(shapes, 1);
  int64_t step = 0;
  const double unfused = median_ms(c.reps, [&] { unfused_adamw_step(reference, o, ++step); });

  ParamSet fused_set = make_params(shapes, 1);
  tessel::nn::optim::AdamW fused(fused_set.params, o);
  tessel::set_num_threads(1);
  const double fused_one = median_ms(c.reps, [&] { fused.step(); });
  tessel::set_num_threads(threads);
  const double fused_many = median_ms(c.reps, [&] { fused.step(); });

  // Bytes the fused step must move: read p, g, m, v; write p, m, v.
  const double bytes = 7.0 * 4.0 * static_cast<double>(fused_set.numel);
  auto row = [&](const char* name, double ms) {
    fmt::print("{:<44} {:>10.3f} {:>8.2f} {:>8.2f}x\n", name, ms, bytes / (ms * 1e6), unfused / ms);
  };
  fmt::print("\nAdamW step: {} tensors, {} parameters (GPT layers={} embd={} context={})\n",
             shapes.size(), fused_set.numel, c.layers, c.embd, c.block);
  fmt::print("{:<44} {:>10} {:>8} {:>9}\n", "implementation", "ms/step", "GB/s", "vs unfused");
  row("unfused per-parameter loop (1 thread)", unfused);
  row("tessel fused multi-tensor (1 thread)", fused_one);
  row(fmt::format("tessel fused multi-tensor ({} threads)", threads).c_str(), fused_many);
}

// Times of one training step's phases, in milliseconds (medians over c.steps).
struct StepTimes {
  double forward = 0, backward = 0, update = 0;
  double total() const { return forward + backward + update; }
};

StepTimes time_training(const Config& c, int threads) {
  tessel::set_num_threads(threads);
  tessel::nn::GPT model({.vocab_size = c.vocab,
                         .block_size = c.block,
                         .n_layer = c.layers,
                         .n_head = c.heads,
                         .n_embd = c.embd,
                         .seed = 1});
  tessel::nn::optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  std::mt19937 rng(2);
  std::vector<int64_t> x(c.batch * c.block), y(c.batch * c.block);
  for (auto& v : x) v = rng() % c.vocab;
  for (auto& v : y) v = rng() % c.vocab;
  const Tensor tokens = tessel::from_vector<int64_t>(x, {c.batch, c.block});
  const Tensor targets = tessel::from_vector<int64_t>(y, {c.batch, c.block});
  std::vector<double> fwd, bwd, upd;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  for (int64_t step = 0; step < c.steps + 2; ++step) {  // two warm-up steps
    auto t0 = Clock::now();
    Tensor loss = tessel::nn::GPT::loss(model(tokens), targets);
    const double f = ms_since(t0);
    t0 = Clock::now();
    tessel::backward(loss);
    const double b = ms_since(t0);
    t0 = Clock::now();
    tessel::nn::optim::clip_grad_norm(model.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    const double u = ms_since(t0);
    if (step >= 2) {
      fwd.push_back(f);
      bwd.push_back(b);
      upd.push_back(u);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(fwd), median(bwd), median(upd)};
}

void bench_training(const Config& c) {
  const int threads =
      c.threads > 0 ? c.threads : static_cast<int>(std::thread::hardware_concurrency());
  const StepTimes one = time_training(c, 1);
  const StepTimes many = time_training(c, threads);
  const double tokens = static_cast<double>(c.batch * c.block);
  fmt::print(
      "Training step: GPT layers={} heads={} embd={} context={}, batch {} ({} tokens/step)\n",
      c.layers, c.heads, c.embd, c.block, c.batch, c.batch * c.block);
  fmt::print("{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "threads", "fwd ms", "bwd ms",
             "update ms", "step ms", "tok/s", "speed-up");
  auto row = [&](int n, const StepTimes& t) {
    fmt::print("{:<12} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.0f} {:>8.2f}x\n", n, t.forward,
               t.backward, t.update, t.total(), tokens / (t.total() / 1e3),
               one.total() / t.total());
  };
  row(1, one);
  row(threads, many);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"Training throughput and optimizer step time of the train_gpt model"};
  app.add_option("--layers", c.layers, "training model: transformer blocks");
  app.add_option("--heads", c.heads, "training model: attention heads");
  app.add_option("--embd", c.embd, "training model: embedding width");
  app.add_option("--block", c.block, "training model: context length");
  app.add_option("--batch", c.batch, "training model: sequences per step");
  app.add_option("--steps", c.steps, "timed training steps (median reported)");
  app.add_option("--adamw-layers", c.adamw_layers, "AdamW comparison model: blocks");
  app.add_option("--adamw-embd", c.adamw_embd, "AdamW comparison model: embedding width");
  app.add_option("--reps", c.reps, "timed AdamW steps (median reported)");
  app.add_option("--threads", c.threads, "threads for the multi-threaded rows (0: all cores)");
  CLI11_PARSE(app, argc, argv);
  bench_training(c);
  bench_adamw(c);
  return 0;
}
