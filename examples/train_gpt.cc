// examples/train_gpt: trains a small byte-level GPT on the bundled corpus (examples/data/) on
// the CPU, printing loss, tokens/s and a progress bar, then saves a safetensors checkpoint and
// prints a short sample of generated text.
//
//   build/rel/examples/train_gpt                   # 400 steps, about 2 minutes on 2 cores
//   build/rel/examples/train_gpt --layers 4 --embd 128 --seq 128 --steps 2000
//
// Tokens are bytes (vocabulary 256). The loss is in nats per byte; the corpus's unigram
// entropy, printed at the start, is what a model that ignores context would reach.
//
// Under tessel-run (WORLD_SIZE > 1) it trains data-parallel over a DeviceMesh (Gloo through the
// job's store), with torchtitan's names for the mesh dimensions: --dp-shard S ranks shard the
// model with FSDP (default: every rank), --dp-replicate R replicas of that make HSDP, and --ddp
// replicates the model instead (DDP). Every rank draws the same global batch of --batch
// sequences from --seed and takes its slice, so a run on N ranks sees the data a 1-rank run
// sees. Rank 0 logs (and with --log-json writes one JSON object per step), then gathers the
// whole model to evaluate, save and sample.
//
//   tessel-run --standalone --nproc-per-node 2 build/release/examples/train_gpt --threads 1
//   tessel-run --standalone --nproc-per-node 4 build/release/examples/train_gpt
//       --dp-replicate 2 --dp-shard 2 --log-json /tmp/steps.jsonl      (one command line)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tessel/base/error.h"
#include "tessel/collectives/init.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/nn/optim/schedule.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/parallel/fsdp.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"
#include "tessel/tensor/thread_pool.h"

namespace {

using namespace tessel;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string data = TESSEL_EXAMPLES_DATA_DIR "/corpus.txt";
  std::string checkpoint = "train_gpt.safetensors";
  int64_t steps = 400;
  int64_t batch = 16;
  int64_t seq = 64;
  int64_t layers = 3;
  int64_t heads = 4;
  int64_t embd = 96;
  double lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup = 20;
  double weight_decay = 0.1;
  double clip = 1.0;
  uint64_t seed = 1;
  int64_t log_every = 20;
  int64_t eval_batches = 8;
  int64_t sample = 200;
  double temperature = 0.8;
  int threads = 0;
  int64_t dp_shard = -1;     // ranks sharding the model (FSDP); -1: every rank not used otherwise
  int64_t dp_replicate = 1;  // replicas of the sharded model (HSDP when > 1)
  bool ddp = false;          // replicate the model instead of sharding it
  std::string log_json;      // one JSON object per step
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.good(), IoError, "cannot open corpus '{}'", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Entropy (nats) of the byte distribution: the loss of the best context-free model.
double unigram_entropy(const std::string& text) {
  std::vector<double> counts(256, 0.0);
  for (unsigned char c : text) counts[c] += 1;
  double h = 0;
  for (double n : counts) {
    if (n > 0) h -= n / text.size() * std::log(n / text.size());
  }
  return h;
}

// Random windows of `text`: tokens (B, T) and the next byte of each as targets. Every rank
// draws the same global batch and keeps its rows.
struct Batcher {
  const std::string& text;
  std::mt19937_64 rng;

  std::pair<Tensor, Tensor> next(int64_t B, int64_t T) {
    std::vector<int64_t> x(B * T), y(B * T);
    std::uniform_int_distribution<size_t> start(0, text.size() - static_cast<size_t>(T) - 1);
    for (int64_t b = 0; b < B; ++b) {
      const size_t s = start(rng);
      for (int64_t t = 0; t < T; ++t) {
        x[b * T + t] = static_cast<unsigned char>(text[s + t]);
        y[b * T + t] = static_cast<unsigned char>(text[s + t + 1]);
      }
    }
    return {from_vector<int64_t>(x, {B, T}), from_vector<int64_t>(y, {B, T})};
  }
};

double evaluate(nn::GPT& model, Batcher& batcher, const Flags& f) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < f.eval_batches; ++i) {
    auto [x, y] = batcher.next(f.batch, f.seq);
    total += item(nn::GPT::loss(model(x), y));
  }
  model.train();
  return total / static_cast<double>(f.eval_batches);
}

std::string progress_bar(int64_t done, int64_t total, int width = 20) {
  const int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::string bar;
  for (int i = 0; i < width; ++i) bar += i < filled ? "#" : ".";
  return bar;
}

// Continues `prompt` by sampling each next byte from softmax(logits / temperature) of the last
// position (seeded, so runs repeat).
std::string sample(nn::GPT& model, const std::string& prompt, int64_t n, double temperature,
                   uint64_t seed) {
  NoGradGuard no_grad;
  model.eval();
  std::mt19937_64 rng(seed);
  std::vector<int64_t> tokens(prompt.begin(), prompt.end());
  std::string out;
  const int64_t block = model.config().block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - block);
    std::vector<int64_t> window(tokens.begin() + start, tokens.end());
    const int64_t T = static_cast<int64_t>(window.size());
    const Tensor last = select(select(model(from_vector<int64_t>(window, {1, T})), 0, 0), 0, T - 1);
    const std::vector<float> probs = to_vector<float>(softmax(div(last, temperature), -1));
    std::discrete_distribution<int64_t> pick(probs.begin(), probs.end());
    tokens.push_back(pick(rng));
    out += static_cast<char>(tokens.back());
  }
  model.train();
  return out;
}

// The mean of `value` over the world (for logging the global loss).
double world_mean(ProcessGroup* world, double value) {  // every rank, every step
  if (world == nullptr) return value;
  Tensor t = from_vector<float>({static_cast<float>(value)});
  world->all_reduce(t, {.op = ReduceOp::kAvg});
  return t.data<float>()[0];
}

// How the ranks split the work: a mesh (dp_replicate, dp_shard) over the world, and this rank's
// slice of the global batch.
struct Layout {
  std::shared_ptr<ProcessGroup> world;
  std::unique_ptr<DeviceMesh> mesh;
  int64_t replicate = 1, shard = 1;  // mesh sizes
  int64_t batch_index = 0;           // this rank's slice of the global batch
  int64_t batch_parts = 1;
};

Layout make_layout(const Flags& f) {
  Layout l;
  if (read_launch_env().world_size > 1) l.world = init_process_group();
  const int64_t world = l.world ? l.world->size() : 1;
  l.replicate = f.dp_replicate;
  TESSEL_CHECK(l.replicate >= 1 && world % l.replicate == 0, InvalidArgument,
               "--dp-replicate {} does not divide the {} ranks", l.replicate, world);
  l.shard = f.dp_shard < 0 ? world / l.replicate : f.dp_shard;
  TESSEL_CHECK(l.replicate * l.shard == world, InvalidArgument,
               "--dp-replicate {} x --dp-shard {} = {} ranks, but the job has {}", l.replicate,
               l.shard, l.replicate * l.shard, world);
  TESSEL_CHECK(f.batch % world == 0, InvalidArgument,
               "--batch {} (the global batch) does not split evenly over {} data-parallel ranks",
               f.batch, world);
  if (l.world) {
    l.mesh = std::make_unique<DeviceMesh>(
        init_device_mesh(l.world, {l.replicate, l.shard}, {"dp_replicate", "dp_shard"}));
    l.batch_index = l.world->rank();
    l.batch_parts = world;
  }
  return l;
}

// FSDP (with HSDP when replicated) on each block and then the root; the model is built on the
// meta device so that only this rank's shards are ever allocated.
std::unique_ptr<nn::GPT> build_model(const Flags& f, const nn::GptConfig& config,
                                     const Layout& l) {
  if (!l.world || f.ddp) {
    auto model = std::make_unique<nn::GPT>(config);
    if (l.world) {  // DDP: every rank starts from rank 0's parameters
      for (Tensor p : model->parameters()) l.world->broadcast(p, {.root = 0});
    }
    return model;
  }
  std::unique_ptr<nn::GPT> model;
  {
    DefaultDeviceGuard meta(Device::meta());
    model = std::make_unique<nn::GPT>(config);
  }
  const DeviceMesh fsdp_mesh =
      l.replicate > 1 ? l.mesh->slice({"dp_replicate", "dp_shard"}) : (*l.mesh)["dp_shard"];
  auto& blocks = model->submodule("transformer.h");
  for (int64_t i = 0; i < config.n_layer; ++i) {
    fully_shard(blocks.child(std::to_string(i)), fsdp_mesh);
  }
  fully_shard(*model, fsdp_mesh);
  model->to_empty(Device::cpu());
  model->init_weights();  // each shard gets its part of the whole model's initial values
  return model;
}

// DDP's gradient averaging: one all_reduce over a flat bucket of every gradient.
void average_gradients(ProcessGroup& world, const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) grads.push_back(reshape(p.grad(), {-1}));
  Tensor bucket = cat(grads, 0);
  world.all_reduce(bucket, {.op = ReduceOp::kAvg});
  int64_t at = 0;
  for (const Tensor& p : params) {
    copy_(p.grad(), view(narrow(bucket, 0, at, p.numel()), p.shape()));
    at += p.numel();
  }
}

int run(const Flags& f) {
  Layout layout = make_layout(f);
  ProcessGroup* world = layout.world.get();
  const int rank = world ? world->rank() : 0;
  const bool lead = rank == 0;
  auto print = [lead]<typename... A>(fmt::format_string<A...> format, A&&... args) {
    if (lead) fmt::print(format, std::forward<A>(args)...);
  };

  if (f.threads > 0) set_num_threads(f.threads);
  const std::string text = read_file(f.data);
  TESSEL_CHECK(text.size() > static_cast<size_t>(10 * (f.seq + 1)), InvalidArgument,
               "corpus '{}' has {} bytes, too few for sequences of {}", f.data, text.size(),
               f.seq);
  const size_t split = text.size() * 9 / 10;
  const std::string train_text = text.substr(0, split);
  const std::string val_text = text.substr(split);

  const nn::GptConfig config{.vocab_size = 256, .block_size = f.seq, .n_layer = f.layers,
                             .n_head = f.heads, .n_embd = f.embd, .seed = f.seed};
  std::unique_ptr<nn::GPT> model = build_model(f, config, layout);
  nn::optim::AdamW opt(model->parameters(), {.lr = f.lr, .beta1 = 0.9, .beta2 = 0.95,
                                             .weight_decay = f.weight_decay});
  nn::optim::WarmupCosine schedule({.max_lr = f.lr, .min_lr = f.min_lr,
                                    .warmup_steps = std::min(f.warmup, f.steps),
                                    .total_steps = f.steps});
  Batcher train{train_text, std::mt19937_64(f.seed)};
  Batcher val{val_text, std::mt19937_64(f.seed + 1)};
  std::ofstream json;
  if (lead && !f.log_json.empty()) {
    json.open(f.log_json);
    TESSEL_CHECK(json.good(), IoError, "cannot write --log-json file '{}'", f.log_json);
  }

  if (world) {
    print("{} over {} ranks ({}): mesh {}, {} of {} sequences per rank per step\n",
          f.ddp ? "data parallel (DDP)"
                : layout.replicate > 1 ? "HSDP (FSDP within replicas)" : "FSDP",
          world->size(), world->backend_name(), layout.mesh->shape_str(),
          f.batch / layout.batch_parts, f.batch);
  }
  print("corpus {}: {} bytes ({} train / {} val), unigram entropy {:.3f} nats/byte\n", f.data,
        text.size(), train_text.size(), val_text.size(), unigram_entropy(text));
  print("model: {} layers, {} heads, embd {}, context {}: {} parameters; global batch {} x {}, "
        "{} threads\n",
        f.layers, f.heads, f.embd, f.seq, nn::GPT(config).num_parameters(), f.batch, f.seq,
        num_threads());

  const int64_t tokens_per_step = f.batch * f.seq;
  const int64_t rows = f.batch / layout.batch_parts;
  auto window_start = Clock::now();
  const auto run_start = window_start;
  double window_loss = 0;
  int64_t window_steps = 0;
  reset_peak_memory_stats(Device::cpu());
  for (int64_t step = 0; step < f.steps; ++step) {
    const auto step_start = Clock::now();
    auto [gx, gy] = train.next(f.batch, f.seq);
    const Tensor x = narrow(gx, 0, layout.batch_index * rows, rows);
    const Tensor y = narrow(gy, 0, layout.batch_index * rows, rows);
    const Tensor loss = nn::GPT::loss((*model)(x), y);
    backward(loss);
    if (world && f.ddp) average_gradients(*world, model->parameters());
    const double norm = clip_grad_norm(model->parameters(), f.clip);
    opt.set_lr(schedule.lr(step));
    opt.step();
    opt.zero_grad();
    const double step_loss = world_mean(world, item(loss));
    window_loss += step_loss;
    ++window_steps;
    if (json.is_open()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
      json << fmt::format(
          "{{\"step\": {}, \"loss\": {:.6f}, \"grad_norm\": {:.6f}, \"lr\": {:.6g}, "
          "\"tokens_per_s\": {:.1f}, \"peak_memory_bytes\": {}}}\n",
          step + 1, step_loss, norm, opt.lr(), tokens_per_step / seconds,
          memory_stats(Device::cpu()).peak_allocated_bytes);
      json.flush();
    }
    if ((step + 1) % f.log_every == 0 || step + 1 == f.steps) {
      const double seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
      print("step {:>5}/{} [{}] loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s\n",
            step + 1, f.steps, progress_bar(step + 1, f.steps), window_loss / window_steps,
            opt.lr(), norm, tokens_per_step * window_steps / seconds);
      std::fflush(stdout);
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
  }
  const double total_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  // The whole model on rank 0 (a collective when sharded) for evaluation, saving and sampling.
  nn::GPT whole(config);
  {
    const nn::StateDict state = full_state_dict(*model);
    if (!lead) return 0;
    whole.load_state_dict(state);
  }
  fmt::print("trained {} steps in {:.1f} s ({:.0f} tok/s); peak memory {:.1f} MiB; val loss "
             "{:.4f} nats/byte\n",
             f.steps, total_seconds, tokens_per_step * f.steps / total_seconds,
             memory_stats(Device::cpu()).peak_allocated_bytes / 1048576.0,
             evaluate(whole, val, f));
  whole.save(f.checkpoint, {{"steps", std::to_string(f.steps)},
                            {"config", fmt::format("layers={} heads={} embd={} context={}",
                                                   f.layers, f.heads, f.embd, f.seq)}});
  fmt::print("saved checkpoint {}\n", f.checkpoint);
  if (f.sample > 0) {
    const std::string prompt = "Tale 7: ";
    fmt::print("sample (temperature {}):\n{}{}\n", f.temperature, prompt,
               sample(whole, prompt, f.sample, f.temperature, f.seed));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"Train a small byte-level GPT on the bundled corpus"};
  app.add_option("--data", f.data, "text file to train on");
  app.add_option("--checkpoint", f.checkpoint, "where to save the safetensors checkpoint");
  app.add_option("--steps", f.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", f.batch, "sequences per step (the global batch, split over ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seq", f.seq, "sequence length (and context size)")->check(CLI::PositiveNumber);
  app.add_option("--layers", f.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", f.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--embd", f.embd, "embedding width")->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "peak learning rate");
  app.add_option("--min-lr", f.min_lr, "final learning rate");
  app.add_option("--warmup", f.warmup, "warmup steps");
  app.add_option("--weight-decay", f.weight_decay, "AdamW weight decay");
  app.add_option("--clip", f.clip, "gradient-norm clipping threshold");
  app.add_option("--seed", f.seed, "initialisation and batch sampling seed");
  app.add_option("--log-every", f.log_every, "print every N steps")->check(CLI::PositiveNumber);
  app.add_option("--sample", f.sample, "bytes of text to sample at the end");
  app.add_option("--temperature", f.temperature, "sampling temperature")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", f.threads, "CPU threads (0: all cores)");
  app.add_option("--dp-shard", f.dp_shard,
                 "ranks that shard the model with FSDP (-1: all not used by --dp-replicate)");
  app.add_option("--dp-replicate", f.dp_replicate, "replicas of the sharded model (HSDP)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--ddp", f.ddp, "replicate the model on every rank (DDP) instead of sharding it");
  app.add_option("--log-json", f.log_json, "write one JSON object per step to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(f);
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 1;
  }
}
