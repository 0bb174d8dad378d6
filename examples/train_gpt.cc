// examples/train_gpt: trains a small byte-level GPT on the bundled corpus (examples/data/) on
// the CPU (or, with --device cuda, a GPU), printing loss, tokens/s and a progress bar, then
// saves a safetensors checkpoint and prints a short sample of generated text.
//
//   build/rel/examples/train_gpt                   # 400 steps, about 2 minutes on 2 cores
//   build/rel/examples/train_gpt --layers 4 --embd 128 --seq 128 --steps 2000
//   build/rel/examples/train_gpt --device cuda     # on a GPU (one process)
//
// Tokens are bytes (vocabulary 256). The loss is in nats per byte; the corpus's unigram
// entropy, printed at the start, is what a model that ignores context would reach.
//
// Under tessel-run (WORLD_SIZE > 1) it trains data-parallel over a DeviceMesh (Gloo through the
// job's store), with torchtitan's names for the mesh dimensions: --dp-shard S ranks shard the
// model with FSDP (default: every rank), --dp-replicate R replicas of that make HSDP, and --ddp
// replicates the model instead (DDP). Every rank draws the same global batch of --batch
// sequences from --seed and takes its slice, so a run on N ranks sees the data a 1-rank run
// sees. --tp T splits every layer over T ranks (tensor parallelism, gpt_tp_plan: a tp group
// trains on the same rows; --sequence-parallel also splits the norms and residual stream by
// sequence), composing with --dp-shard / --dp-replicate on a (dp_replicate, dp_shard, tp) mesh.
// Rank 0 logs (and with --log-json writes one JSON object per step), then gathers the whole
// model to evaluate, save and sample.
//
//   tessel-run --standalone --nproc-per-node 2 build/release/examples/train_gpt --threads 1
//   tessel-run --standalone --nproc-per-node 4 build/release/examples/train_gpt
//       --dp-replicate 2 --dp-shard 2 --log-json /tmp/steps.jsonl      (one command line)
//   tessel-run --standalone --nproc-per-node 4 build/release/examples/train_gpt --threads 1
//       --dp-shard 2 --tp 2 --sequence-parallel                         (one command line)
//
// Progress: each --log-every line carries an ETA; with --eval-every N the validation loss is
// printed every N steps; each committed checkpoint gets a line (step, size, seconds); a job
// restarted by tessel-run says which attempt it is and where it resumes.
//
// Exit status: 0 done; 64 usage (unknown flag, missing value); 65 a value that cannot work
// (out of range, a parallel flag without a launcher, a mesh the ranks do not fill); 124 a
// collective timed out (docs/diagnosing-hangs.md); 1 any other failure while training.
//
// On GPUs: --device cuda trains on one GPU per process; under tessel-run each rank takes
// cuda:LOCAL_RANK and the ranks talk over NCCL (the backend follows the device), with the same
// --dp-shard / --dp-replicate / --tp flags:
//
//   tessel-run --standalone --nproc-per-node 2 build/release/examples/train_gpt --device cuda
//       --dp-shard 2                                                    (one command line)
//
// With --checkpoint-dir DIR every --checkpoint-every steps saves a distributed checkpoint (the
// model's shards, AdamW's moments, the step, the batch sampler's state) in the background;
// --resume continues from the latest committed one, bit for bit on the same mesh and resharded
// on another world size (docs/parallel.md, "Checkpoints"). Under tessel-run --max-restarts, a
// restarted job with --resume picks up where the last checkpoint left it.
//
// Generation: --generate --resume --checkpoint-dir DIR continues --prompt by --max-new-tokens
// bytes sampled from the latest checkpoint's model (--temperature 0: greedy; --top-k K), and
// trains nothing. The model flags (--layers, --heads, --embd, --seq) must be the training run's.
//
// Models: --model gpt (the default) or --model llama, a tiny Llama (RMSNorm, rotary positions,
// SwiGLU, grouped-query attention with --kv-heads K/V heads) of the same --layers, --heads and
// --embd; under --tp it is split by llama_tp_plan. --init-hf DIR starts from a Hugging Face
// folder (LlamaForCausalLM or GPT2LMHeadModel; its config.json sets the model and the shapes,
// each rank reading only its shards under FSDP and TP), and --export-hf DIR writes the trained
// model, gathered on rank 0, in that format at the end (transformers loads it):
//
//   tessel-run --standalone --nproc-per-node 4 build/release/examples/train_gpt --model llama
//       --kv-heads 2 --dp-shard 2 --tp 2 --export-hf /tmp/llama-hf         (one command line)

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"
#include "tessel/base/tools/cli.h"
#include "tessel/collectives/init.h"
#include "tessel/data/token_loader.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/activation_checkpoint.h"
#include "tessel/nn/generate.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/hf_format.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/nn/optim/schedule.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/fsdp/clip_grad_norm.h"
#include "tessel/parallel/fsdp/ddp.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/fsdp/state_dict.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/parallel/tp/llama_plan.h"
#include "tessel/parallel/tp/loss.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/cuda/cuda.h"
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
  std::string model = "gpt";  // gpt or llama
  int64_t kv_heads = 0;       // llama: K/V heads (0: --heads)
  std::string init_hf;        // start from this Hugging Face folder
  std::string export_hf;      // write the trained model here in Hugging Face's format
  bool model_given = false;   // --model was on the command line (--init-hf's config must agree)
  double lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup = 20;
  double weight_decay = 0.1;
  double clip = 1.0;
  uint64_t seed = 1;
  int64_t log_every = 20;
  int64_t eval_every = 0;  // steps between validation losses during training (0: at the end)
  int64_t eval_batches = 8;
  int64_t sample = 200;
  double temperature = 0.8;         // 0: greedy
  bool generate = false;            // sample from the latest checkpoint instead of training
  std::string prompt = "Tale 7: ";  // what the sample and --generate continue
  int64_t max_new_tokens = 200;     // bytes --generate samples
  int64_t top_k = 0;                // sample among the k most likely bytes (0: all)
  int threads = 0;
  int64_t dp_shard = -1;     // ranks sharding the model (FSDP); -1: every rank not used otherwise
  int64_t dp_replicate = 1;  // replicas of the sharded model (HSDP when > 1)
  bool ddp = false;          // replicate the model instead of sharding it
  int64_t tp = 1;            // tensor-parallel ranks (each layer split over them)
  bool sequence_parallel = false;
  std::string log_json;            // one JSON object per step
  std::string checkpoint_dir;      // distributed checkpoints (step_<N> folders)
  int64_t checkpoint_every = 0;    // steps between checkpoints (0: none)
  int keep_checkpoints = 3;        // committed checkpoints kept (0: all)
  bool resume = false;             // continue from the latest checkpoint under checkpoint_dir
  std::string device = "cpu";      // where the model trains (one process for devices but the CPU)
  std::string autocast = "auto";   // bf16 mixed precision: auto (on for CUDA devices), bf16, off
  std::string val_data;            // with token shards: validation shards (a glob)
  int64_t grad_accum = 1;          // micro-batches per step, run one after another
  std::string grad_sync = "last";  // gradients communicated on the last micro-batch, or every
  std::string activation_checkpointing = "none";  // none, full or selective, per block
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

// A stream of batches (x, y): each call gives the next.
using BatchStream = std::function<std::pair<Tensor, Tensor>()>;

// The model train_gpt trains: a GPT or a Llama, shaped by the flags or, with --init-hf, by the
// folder's config.json.
struct ModelSpec {
  bool is_llama = false;
  nn::GptConfig gpt;
  nn::LlamaConfig llama;
  std::string hf_dir;  // --init-hf: the weights come from there

  int64_t vocab_size() const { return is_llama ? llama.vocab_size : gpt.vocab_size; }
  int64_t layers() const { return is_llama ? llama.n_layers : gpt.n_layer; }
  int64_t context() const { return is_llama ? llama.max_seq_len : gpt.block_size; }
  // The module whose children are the blocks (FSDP shards each).
  const char* blocks() const { return is_llama ? "model.layers" : "transformer.h"; }
  std::unique_ptr<nn::Module> make() const {
    if (is_llama) return std::make_unique<nn::Llama>(llama);
    return std::make_unique<nn::GPT>(gpt);
  }
  void init_weights(nn::Module& model) const {
    if (is_llama) {
      dynamic_cast<nn::Llama&>(model).init_weights();
    } else {
      dynamic_cast<nn::GPT&>(model).init_weights();
    }
  }
  ParallelizePlan tp_plan(bool sequence_parallel) const {
    if (is_llama) {
      return llama_tp_plan({.sequence_parallel = sequence_parallel,
                            .tie_word_embeddings = llama.tie_word_embeddings});
    }
    return gpt_tp_plan({.sequence_parallel = sequence_parallel});
  }
  // "3 layers, 4 heads, embd 96, context 64: 342912 parameters", with the Llama's K/V heads.
  std::string describe() const {
    if (!is_llama) {
      return fmt::format("{} layers, {} heads, embd {}, context {}: {} parameters", gpt.n_layer,
                         gpt.n_head, gpt.n_embd, gpt.block_size, nn::GPT(gpt).num_parameters());
    }
    return fmt::format(
        "llama, {} layers, {} heads ({} K/V), dim {}, hidden {}, {} embeddings, context {}: {} "
        "parameters",
        llama.n_layers, llama.n_heads, llama.kv_heads(), llama.dim, llama.ffn_hidden(),
        llama.tie_word_embeddings ? "tied" : "untied", llama.max_seq_len, llama.num_parameters());
  }
};

// The model of the flags — --model at --layers, --heads (--kv-heads), --embd, --seq over the
// data's vocabulary — or of --init-hf's config.json, which must take the data's tokens and
// --seq. Throws InvalidArgument naming the mismatch.
ModelSpec model_spec(const Flags& f, int64_t data_vocab) {
  ModelSpec spec;
  if (!f.init_hf.empty()) {
    const nn::HfConfig hf = nn::read_hf_config(f.init_hf);
    spec.is_llama = hf.architecture == nn::HfArchitecture::kLlama;
    spec.hf_dir = f.init_hf;
    TESSEL_CHECK(!f.model_given || f.model == (spec.is_llama ? "llama" : "gpt"), InvalidArgument,
                 "--model {} but --init-hf '{}' holds a {}: leave --model out (the folder's "
                 "config sets the model)",
                 f.model, f.init_hf, nn::hf_architecture_name(hf.architecture));
    spec.llama = hf.llama;
    spec.gpt = hf.gpt;
    TESSEL_CHECK(data_vocab <= spec.vocab_size(), InvalidArgument,
                 "--init-hf '{}': the model's vocabulary has {} tokens but the data's has {}: "
                 "train it on token shards of its own tokenizer",
                 f.init_hf, spec.vocab_size(), data_vocab);
    TESSEL_CHECK(f.seq <= spec.context(), InvalidArgument,
                 "--seq {} is longer than the {} positions of --init-hf '{}'", f.seq,
                 spec.context(), f.init_hf);
    return spec;
  }
  spec.is_llama = f.model == "llama";
  spec.gpt = {.vocab_size = data_vocab,
              .block_size = f.seq,
              .n_layer = f.layers,
              .n_head = f.heads,
              .n_embd = f.embd,
              .seed = f.seed};
  // A tiny Llama: Meta's MLP size rule rounded to 32, plain RoPE at theta 10000, untied.
  spec.llama.vocab_size = data_vocab;
  spec.llama.dim = f.embd;
  spec.llama.n_layers = f.layers;
  spec.llama.n_heads = f.heads;
  spec.llama.n_kv_heads = f.kv_heads;
  spec.llama.multiple_of = 32;
  spec.llama.rope_theta = 10000.0;
  spec.llama.max_seq_len = f.seq;
  spec.llama.seed = f.seed;
  return spec;
}

// The mean next-token cross-entropy of logits (B, T, V) against targets (B, T) (nn::GPT::loss
// and nn::Llama::loss are the same).
Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  return nn::GPT::loss(logits, targets);
}

double evaluate(nn::Module& model, const BatchStream& next, const Flags& f) {
  NoGradGuard no_grad;
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < f.eval_batches; ++i) {
    auto [x, y] = next();
    total += item(lm_loss(model(x), y));
  }
  model.train();
  return total / static_cast<double>(f.eval_batches);
}

// "1m05s", "12s", "1h02m".
std::string duration_str(double seconds) {
  const int64_t s = std::llround(std::max(seconds, 0.0));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string progress_bar(int64_t done, int64_t total, int width = 20) {
  const int filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::string bar;
  for (int i = 0; i < width; ++i) bar += i < filled ? "#" : ".";
  return bar;
}

// --prompt continued by `n` bytes of `model` (nn::generate with --temperature, --top-k, --seed)
// over `context` positions.
std::string generate_text(nn::Module& model, int64_t context, const Flags& f, int64_t n) {
  std::vector<int64_t> prompt;
  for (unsigned char c : f.prompt) prompt.push_back(c);
  const std::vector<int64_t> bytes = nn::generate(
      model, prompt, context,
      {.max_new_tokens = n, .temperature = f.temperature, .top_k = f.top_k, .seed = f.seed});
  std::string text;
  for (const int64_t b : bytes) text += static_cast<char>(b);
  return text;
}

// The model flags as a checkpoint records them: "layers=3 heads=4 embd=96 context=64".
std::string model_config_str(const Flags& f) {
  std::string s =
      fmt::format("layers={} heads={} embd={} context={}", f.layers, f.heads, f.embd, f.seq);
  if (f.model == "llama") s += fmt::format(" model=llama kv_heads={}", f.kv_heads);
  if (!f.init_hf.empty()) s += " init_hf=" + f.init_hf;
  return s;
}

// --generate: the model of the checkpoint `loaded` (gathered on rank 0 when sharded: every rank
// calls this) continues --prompt; the text goes to stdout, what produced it to stderr.
int generate_from_checkpoint(const Flags& f, const ModelSpec& spec, nn::Module& model,
                             const std::string& loaded, const checkpoint::CheckpointState& state,
                             bool lead) {
  TESSEL_CHECK(!loaded.empty(), InvalidArgument,
               "--generate: no committed checkpoint under --checkpoint-dir '{}': expected one "
               "saved by a run with --checkpoint-every",
               f.checkpoint_dir);
  // A checkpoint of a larger model would load into a smaller one (it may hold more tensors).
  if (const auto saved = state.metadata.find("model.config"); saved != state.metadata.end()) {
    TESSEL_CHECK(saved->second == model_config_str(f), InvalidArgument,
                 "--generate: {} holds a model of {}, but the flags give {}: pass the training "
                 "run's --layers, --heads, --embd and --seq",
                 loaded, saved->second, model_config_str(f));
  }
  std::unique_ptr<nn::Module> whole = spec.make();
  {
    const nn::StateDict state = full_state_dict(model);
    if (!lead) return 0;
    whole->load_state_dict(state);
  }
  fmt::print(stderr, "train_gpt: {} bytes from {} (step {}), temperature {}, top-k {}, seed {}\n",
             f.max_new_tokens, loaded, state.step, f.temperature, f.top_k, f.seed);
  fmt::print("{}{}\n", f.prompt, generate_text(*whole, spec.context(), f, f.max_new_tokens));
  return 0;
}

// The mean of `value` over the world (for logging the global loss), through the world's
// device (NCCL moves GPU memory only).
double world_mean(ProcessGroup* world, double value) {  // every rank, every step
  if (world == nullptr) return value;
  Tensor t = to(from_vector<float>({static_cast<float>(value)}), world->default_device());
  world->all_reduce(t, {.op = ReduceOp::kAvg});
  return item(t);
}

// Where this process trains: --device, with "cuda" meaning cuda:LOCAL_RANK under a launcher
// (one GPU per process). Fails with the reason when CUDA is asked for and none is usable.
Device training_device(const Flags& f, const LaunchEnv& env) {
  Device device = parse_device(f.device);
  if (device.is_cuda()) {
    TESSEL_CHECK(cuda::device_count() > 0, Unavailable,
                 "--device {}: no CUDA device is usable here: {}", f.device,
                 cuda::unavailable_reason());
    if (f.device == "cuda") device.index = env.local_rank;
  }
  check_device_available(device);
  if (device.is_cuda()) cuda::set_device(device.index);  // before any CUDA work: no context on 0
  return device;
}

// How the ranks split the work: a mesh (dp_replicate, dp_shard[, tp]) over the world, and this
// rank's slice of the global batch (the same for every rank of a tp group).
struct Layout {
  std::shared_ptr<ProcessGroup> world;
  std::unique_ptr<DeviceMesh> mesh;
  int64_t replicate = 1, shard = 1, tp = 1;  // mesh sizes
  int64_t batch_index = 0;                   // this rank's slice of the global batch
  int64_t batch_parts = 1;
};

// The world's backend follows the device: NCCL for CUDA, Gloo (or MPI) for the CPU.
Layout make_layout(const Flags& f, Device device) {
  Layout l;
  if (read_launch_env().world_size > 1) l.world = init_process_group({.device = device});
  const int64_t world = l.world ? l.world->size() : 1;
  l.tp = f.tp;
  TESSEL_CHECK(l.tp >= 1 && world % l.tp == 0, InvalidArgument,
               "--tp {} does not divide the {} ranks", l.tp, world);
  TESSEL_CHECK(l.tp == 1 || !f.ddp, InvalidArgument,
               "--ddp replicates the whole model; with --tp {} use --dp-shard / --dp-replicate",
               l.tp);
  TESSEL_CHECK(!f.sequence_parallel || f.seq % l.tp == 0, InvalidArgument,
               "--sequence-parallel splits the sequence of {} over --tp {}: make --seq a multiple",
               f.seq, l.tp);
  l.replicate = f.dp_replicate;
  TESSEL_CHECK(l.replicate >= 1 && world % (l.replicate * l.tp) == 0, InvalidArgument,
               "--dp-replicate {} x --tp {} does not divide the {} ranks", l.replicate, l.tp,
               world);
  l.shard = f.dp_shard < 0 ? world / (l.replicate * l.tp) : f.dp_shard;
  TESSEL_CHECK(l.replicate * l.shard * l.tp == world, InvalidArgument,
               "--dp-replicate {} x --dp-shard {} x --tp {} = {} ranks, but the job has {}",
               l.replicate, l.shard, l.tp, l.replicate * l.shard * l.tp, world);
  const int64_t dp = l.replicate * l.shard;
  TESSEL_CHECK(f.batch % dp == 0, InvalidArgument,
               "--batch {} (the global batch) does not split evenly over {} data-parallel ranks",
               f.batch, dp);
  TESSEL_CHECK(f.batch / dp % f.grad_accum == 0, InvalidArgument,
               "--grad-accum {}: the {} sequences of each data-parallel rank (--batch {} over {}) "
               "do not split into {} equal micro-batches",
               f.grad_accum, f.batch / dp, f.batch, dp, f.grad_accum);
  if (l.world) {
    std::vector<int64_t> shape = {l.replicate, l.shard};
    std::vector<std::string> names = {"dp_replicate", "dp_shard"};
    if (l.tp > 1) {
      shape.push_back(l.tp);
      names.push_back("tp");
    }
    l.mesh = std::make_unique<DeviceMesh>(init_device_mesh(l.world, shape, names));
    l.batch_index = l.mesh->local_rank("dp_replicate") * l.shard + l.mesh->local_rank("dp_shard");
    l.batch_parts = dp;
  }
  return l;
}

// Whether `path` names token shards (tessel-tokenize's or llm.c's) rather than a text file: a
// glob pattern, or a file that starts with a shard magic.
bool names_token_shards(const std::string& path) {
  if (path.find_first_of("*?[") != std::string::npos) return true;
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, sizeof head);
  int32_t magic = 0;
  std::memcpy(&magic, head, sizeof magic);
  return std::equal(head, head + 8, data::kShardMagic) || magic == data::kLlmcMagicGpt2 ||
         magic == data::kLlmcMagicLlama3;
}

// What the model trains on. A text file (--data, the bundled corpus by default): bytes are the
// tokens, batches are random windows, every rank draws the same global batch from --seed and
// keeps its rows, the first 90 % train and the last 10 % validate. Token shards (--data GLOB):
// a data::TokenLoader in which each data-parallel rank reads only its rows of every global batch
// (the ranks of a tp group the same ones), validated on --val-data (or the training shards'
// first batches); its global position goes into the checkpoint, so a resumed job on any number
// of ranks continues the same token stream (docs/data.md, "Loader"). Not movable (the batcher
// refers to the text it holds).
class TrainingData {
 public:
  TrainingData(const Flags& f, const Layout& l)
      : f_(f), part_(l.batch_index), parts_(l.batch_parts) {
    if (!names_token_shards(f.data)) {
      text_ = read_file(f.data);
      TESSEL_CHECK(text_.size() > static_cast<size_t>(10 * (f.seq + 1)), InvalidArgument,
                   "corpus '{}' has {} bytes, too few for sequences of {}", f.data, text_.size(),
                   f.seq);
      const size_t split = text_.size() * 9 / 10;
      train_text_ = text_.substr(0, split);
      val_text_ = text_.substr(split);
      batcher_.emplace(Batcher{train_text_, std::mt19937_64(f.seed)});
      description_ = fmt::format(
          "corpus {}: {} bytes ({} train / {} val), unigram entropy {:.3f} nats/byte", f.data,
          text_.size(), train_text_.size(), val_text_.size(), unigram_entropy(text_));
      return;
    }
    train_shards_ = data::expand_shard_glob(f.data);
    val_shards_ = f.val_data.empty() ? train_shards_ : data::expand_shard_glob(f.val_data);
    loader_.emplace(train_shards_, data::TokenLoaderOptions{.seq_len = f.seq,
                                                            .global_batch = f.batch,
                                                            .dp_rank = part_,
                                                            .dp_size = parts_,
                                                            .seed = f.seed});
    // The vocabulary: the largest the shards' headers give, else the largest token + 1.
    uint64_t tokens = 0;
    for (const auto& path : train_shards_) {
      const data::TokenShard shard(path);
      tokens += shard.size();
      uint32_t v = shard.vocab_size();
      if (v == 0) {
        for (size_t i = 0; i < shard.size(); ++i) v = std::max(v, shard[i] + 1);
      }
      vocab_ = std::max<int64_t>(vocab_, v);
    }
    description_ = fmt::format(
        "token shards {}: {} files, {} tokens, vocabulary {}; {} sequences of {} + 1 per epoch "
        "({} steps); validation on {}",
        f.data, train_shards_.size(), tokens, vocab_, loader_->sequences_per_epoch(), f.seq,
        loader_->batches_per_epoch(),
        f.val_data.empty() ? std::string("the first batches of the training shards") : f.val_data);
  }
  TrainingData(const TrainingData&) = delete;
  TrainingData& operator=(const TrainingData&) = delete;

  int64_t vocab_size() const { return vocab_; }
  const std::string& description() const { return description_; }

  // This rank's rows (x, y) of the next global training batch, on the CPU.
  std::pair<Tensor, Tensor> next_train() {
    if (loader_) {
      const data::TokenBatch b = loader_->next();
      return {b.inputs(), b.targets()};
    }
    return rows_of(batcher_->next(f_.batch, f_.seq), part_, parts_);
  }

  // The same validation batches on every call: each step of the stream gives rows `part` of
  // `parts` of the next global batch of --batch sequences.
  BatchStream validation(int64_t part, int64_t parts, uint64_t seed) const {
    if (!loader_) {
      auto batcher = std::make_shared<Batcher>(Batcher{val_text_, std::mt19937_64(seed)});
      return [this, batcher, part, parts] {
        return rows_of(batcher->next(f_.batch, f_.seq), part, parts);
      };
    }
    auto loader = std::make_shared<data::TokenLoader>(
        val_shards_, data::TokenLoaderOptions{.seq_len = f_.seq,
                                              .global_batch = f_.batch,
                                              .dp_rank = part,
                                              .dp_size = parts,
                                              .shuffle = false});
    return [loader] {
      const data::TokenBatch b = loader->next();
      return std::pair{b.inputs(), b.targets()};
    };
  }

  // The training position, in the checkpoint's metadata and back: the byte sampler's generator
  // or the loader's global state (JSON).
  void save(std::map<std::string, std::string>& metadata) const {
    if (loader_) {
      metadata["data.loader"] = loader_->state().to_json();
      return;
    }
    std::ostringstream sampler;
    sampler << batcher_->rng;
    metadata["data.sampler"] = sampler.str();
  }
  void restore(const std::map<std::string, std::string>& metadata) {
    const char* key = loader_ ? "data.loader" : "data.sampler";
    const auto it = metadata.find(key);
    TESSEL_CHECK(it != metadata.end(), InvalidArgument,
                 "--resume: the checkpoint has no '{}': it was saved by a run on {}", key,
                 loader_ ? "a text corpus, not token shards" : "token shards, not a text corpus");
    if (loader_) {
      loader_->restore(data::TokenLoaderState::from_json(it->second));
    } else {
      std::istringstream(it->second) >> batcher_->rng;
    }
  }

 private:
  std::pair<Tensor, Tensor> rows_of(std::pair<Tensor, Tensor> global, int64_t part,
                                    int64_t parts) const {
    const int64_t rows = f_.batch / parts;
    return {narrow(global.first, 0, part * rows, rows),
            narrow(global.second, 0, part * rows, rows)};
  }

  const Flags& f_;
  int64_t part_, parts_;
  int64_t vocab_ = 256;
  std::string description_;
  std::string text_, train_text_, val_text_;
  std::optional<Batcher> batcher_;
  std::vector<std::filesystem::path> train_shards_, val_shards_;
  std::optional<data::TokenLoader> loader_;
};

// The validation loss of the model as it trains (every rank: a collective when sharded), on
// the same --eval-batches batches each time: each rank takes its rows of every global batch as
// in training, and the loss is averaged over the world.
double evaluate_during_training(nn::Module& model, int64_t vocab, const TrainingData& data,
                                const Flags& f, const Layout& l, Device device, bool autocast) {
  NoGradGuard no_grad;
  model.eval();
  const BatchStream val = data.validation(l.batch_index, l.batch_parts, f.seed + 2);
  double total = 0;
  for (int64_t i = 0; i < f.eval_batches; ++i) {
    auto [rx, ry] = val();
    const Tensor x = to(rx, device);
    const Tensor y = to(ry, device);
    std::optional<AutocastGuard> mixed;
    if (autocast) mixed.emplace(DType::kBF16);
    const Tensor logits = model(x);
    total += item(l.tp > 1 ? loss_parallel_cross_entropy(logits, y, (*l.mesh)["tp"], vocab)
                           : lm_loss(logits, y));
  }
  model.train();
  // FSDP's root keeps its gathered parameters after forward for the backward that follows one
  // in training; after this forward none comes, so it is freed here.
  if (FSDPModule* root = fsdp_module(model)) root->reshard();
  return world_mean(l.world.get(), total / static_cast<double>(f.eval_batches));
}

// FSDP (with HSDP when replicated) on each block and then the root; the model is built on the
// meta device so that only this rank's shards are ever allocated, then initialised or, with
// --init-hf, loaded (each rank reading its shards' bytes). With --ddp the whole model is
// replicated (`ddp` is then set).
std::unique_ptr<nn::Module> build_model(const Flags& f, const ModelSpec& spec, const Layout& l,
                                        std::unique_ptr<DDPModule>* ddp, Device device) {
  if (!l.world || f.ddp) {
    std::unique_ptr<nn::Module> model = spec.make();
    if (!spec.hf_dir.empty()) nn::load_hf_weights(*model, spec.hf_dir);
    model->to(device);  // initialised on the CPU: the same values on every device
    if (l.world) {
      // Over every rank: the (dp_replicate, dp_shard) mesh flattened.
      const DeviceMesh dp = l.mesh->flatten({"dp_replicate", "dp_shard"}, "dp");
      *ddp = std::make_unique<DDPModule>(replicate(*model, dp));
    }
    return model;
  }
  std::unique_ptr<nn::Module> model;
  {
    DefaultDeviceGuard meta(Device::meta());
    model = spec.make();
  }
  // Tensor parallelism first (each layer split over tp), then FSDP over the data-parallel ranks.
  if (l.tp > 1) parallelize_module(*model, (*l.mesh)["tp"], spec.tp_plan(f.sequence_parallel));
  if (l.replicate * l.shard > 1) {
    const DeviceMesh fsdp_mesh =
        l.replicate > 1 ? l.mesh->slice({"dp_replicate", "dp_shard"}) : (*l.mesh)["dp_shard"];
    auto& blocks = model->submodule(spec.blocks());
    for (int64_t i = 0; i < spec.layers(); ++i) {
      fully_shard(blocks.child(std::to_string(i)), fsdp_mesh);
    }
    fully_shard(*model, fsdp_mesh);
  }
  model->to_empty(device);
  if (!spec.hf_dir.empty()) {
    nn::load_hf_weights(*model, spec.hf_dir);  // each shard reads its box of every tensor
  } else {
    spec.init_weights(*model);  // each shard gets its part of the whole model's initial values
  }
  return model;
}

// Forward and backward of this rank's rows (x, y) in --grad-accum micro-batches run one after
// another, each loss scaled by 1/N so that the gradients are those of the whole batch. FSDP and
// DDP communicate gradients on the last micro-batch only (set_requires_gradient_sync(false)
// before the others: FSDP keeps unsharded gradients, DDP local ones), or on every one with
// --grad-sync every (FSDP then holds only sharded gradients between micro-batches). Returns the
// rank's loss on its rows.
double accumulate_gradients(nn::Module& model, int64_t vocab, DDPModule* ddp, const Tensor& x,
                            const Tensor& y, const Flags& f, const Layout& l, Device device,
                            bool autocast) {
  FSDPModule* fsdp = fsdp_module(model);
  const int64_t micro_rows = x.size(0) / f.grad_accum;
  double loss_sum = 0;
  for (int64_t m = 0; m < f.grad_accum; ++m) {
    const bool sync = f.grad_sync == "every" || m + 1 == f.grad_accum;
    if (fsdp) fsdp->set_requires_gradient_sync(sync);
    if (ddp) ddp->set_requires_gradient_sync(sync);
    const Tensor xm = to(narrow(x, 0, m * micro_rows, micro_rows), device);
    const Tensor ym = to(narrow(y, 0, m * micro_rows, micro_rows), device);
    Tensor loss;
    {
      std::optional<AutocastGuard> mixed;
      if (autocast) mixed.emplace(DType::kBF16);
      const Tensor logits = model(xm);  // with --tp: this rank's share of the vocabulary
      loss = l.tp > 1 ? loss_parallel_cross_entropy(logits, ym, (*l.mesh)["tp"], vocab)
                      : lm_loss(logits, ym);
      if (f.grad_accum > 1) loss = div(loss, static_cast<double>(f.grad_accum));
    }
    backward(loss);
    loss_sum += item(loss);
  }
  return loss_sum;
}

int run(const Flags& f) {
  const Device device = training_device(f, read_launch_env());
  Layout layout = make_layout(f, device);
  ProcessGroup* world = layout.world.get();
  const int rank = world ? world->rank() : 0;
  const bool lead = rank == 0;
  auto print = [lead]<typename... A>(fmt::format_string<A...> format, A&&... args) {
    if (lead) fmt::print(format, std::forward<A>(args)...);
  };

  if (f.threads > 0) set_num_threads(f.threads);
  TrainingData data(f, layout);

  // bf16 autocast (f32 parameters and optimizer state) by default on CUDA, as nanoGPT does: the
  // matmuls run on bf16 tensor cores and attention on the fused kernels (cuDNN on Hopper,
  // flash_cuda otherwise), which take bf16 and f16 only; f32 attention on a GPU runs the slow
  // reference kernel.
  TESSEL_CHECK(f.autocast == "auto" || f.autocast == "bf16" || f.autocast == "off", InvalidArgument,
               "--autocast {}: expected auto, bf16 or off", f.autocast);
  const bool autocast = f.autocast == "bf16" || (f.autocast == "auto" && device.is_cuda());
  const ModelSpec spec = model_spec(f, data.vocab_size());
  std::unique_ptr<DDPModule> ddp;
  std::unique_ptr<nn::Module> model = build_model(f, spec, layout, &ddp, device);
  nn::optim::AdamW opt(model->parameters(),
                       {.lr = f.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = f.weight_decay});
  nn::optim::WarmupCosine schedule({.max_lr = f.lr,
                                    .min_lr = f.min_lr,
                                    .warmup_steps = std::min(f.warmup, f.steps),
                                    .total_steps = f.steps});

  // Activation checkpointing inside each block's FSDP/DDP/TP hooks (nn/activation_checkpoint.h).
  nn::checkpoint_blocks(*model, nn::parse_checkpoint_policy(f.activation_checkpointing));

  // Checkpoints: the model (shards under FSDP), AdamW's state and the sampler's position.
  checkpoint::CheckpointState ckpt_state(layout.world);
  std::unique_ptr<checkpoint::Checkpointer> ckpt;
  int64_t first_step = 0;
  std::string resumed_from;
  if (!f.checkpoint_dir.empty()) {
    ckpt_state.metadata["model.config"] = model_config_str(f);  // --generate checks it
    ckpt_state.add_model("model", *model);
    ckpt_state.add_optimizer("optim", opt, *model);
    ckpt = std::make_unique<checkpoint::Checkpointer>(
        layout.world, f.checkpoint_dir,
        checkpoint::CheckpointerOptions{.keep_last = f.keep_checkpoints});
    if (f.resume) {
      if (const auto dir = ckpt->load_latest(ckpt_state)) {
        data.restore(ckpt_state.metadata);
        first_step = ckpt_state.step;
        resumed_from = *dir;
      }
    }
  }
  if (f.generate) {
    return generate_from_checkpoint(f, spec, *model, resumed_from, ckpt_state, lead);
  }
  std::ofstream json;
  if (lead && !f.log_json.empty()) {
    json.open(f.log_json, first_step > 0 ? std::ios::app : std::ios::trunc);
    TESSEL_CHECK(json.good(), IoError, "cannot write --log-json file '{}'", f.log_json);
  }

  if (world) {
    std::string how = f.ddp                  ? "data parallel (DDP)"
                      : layout.replicate > 1 ? "HSDP (FSDP within replicas)"
                      : layout.shard > 1     ? "FSDP"
                                             : "";
    if (layout.tp > 1) {
      how += fmt::format("{}tensor parallel{}", how.empty() ? "" : " x ",
                         f.sequence_parallel ? " (sequence parallel)" : "");
    }
    print("{} over {} ranks ({}): mesh {}, {} of {} sequences per {} per step\n", how,
          world->size(), world->backend_name(), layout.mesh->shape_str(),
          f.batch / layout.batch_parts, f.batch, layout.tp > 1 ? "tp group" : "rank");
    if (layout.tp > 1) {  // every rank: where it sits and the groups it talks in
      std::string groups;
      for (const std::string& dim : layout.mesh->dim_names()) {
        groups += fmt::format("{}{} {}", groups.empty() ? "" : ", ", dim,
                              fmt::join((*layout.mesh)[dim].ranks(), "+"));
      }
      fmt::print("rank {} at mesh coordinate ({}): groups {}\n", rank,
                 fmt::join(layout.mesh->coordinate(), ", "), groups);
      std::fflush(stdout);
    }
  }
  print("{}\n", data.description());
  if (!spec.hf_dir.empty()) print("initialised from Hugging Face folder {}\n", spec.hf_dir);
  print("model: {}; global batch {} x {}, {}{}\n", spec.describe(), f.batch, f.seq,
        device.is_cpu() ? fmt::format("{} threads", num_threads()) : device.str(),
        autocast ? ", bf16 autocast" : "");
  // Under tessel-run --max-restarts: which attempt this is, and where it picks up.
  if (const LaunchEnv launch = read_launch_env(); launch.restart_count > 0) {
    print("restarting: attempt {} of {}, {}\n", launch.restart_count + 1,
          launch.max_restarts >= 0 ? fmt::format("{}", launch.max_restarts + 1) : std::string("?"),
          !resumed_from.empty()
              ? fmt::format("resuming from {}",
                            std::filesystem::path(resumed_from).filename().string())
          : f.checkpoint_dir.empty() ? std::string("from step 0 (no --checkpoint-dir)")
          : f.resume                 ? std::string("from step 0 (no committed checkpoint yet)")
                                     : std::string("from step 0 (no --resume)"));
  }
  if (!resumed_from.empty()) {
    print("resumed from {} at step {}\n", resumed_from, first_step);
  } else if (f.resume) {
    print("no checkpoint under {}: starting from step 0\n", f.checkpoint_dir);
  }

  const int64_t tokens_per_step = f.batch * f.seq;
  auto window_start = Clock::now();
  const auto run_start = window_start;
  double window_loss = 0;
  int64_t window_steps = 0;
  // The checkpoint being written in the background: its line is printed once it commits.
  struct PendingSave {
    Work work;
    int64_t step = 0;
    Clock::time_point start;
  };
  std::optional<PendingSave> pending;
  auto report_save = [&](bool block) {
    if (!pending || (!block && !pending->work.is_completed())) return;
    try {
      pending->work.wait();
    } catch (const Error&) {
      // The checkpointer logged the failure; the final wait() rethrows it.
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - pending->start).count();
    if (lead && pending->work.is_success()) {
      const std::filesystem::path dir =
          std::filesystem::path(f.checkpoint_dir) / fmt::format("step_{:08}", pending->step);
      uint64_t bytes = 0;
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        if (e.is_regular_file(ec)) bytes += e.file_size(ec);
      }
      print("saved checkpoint {} (step {}, {:.1f} MiB, {:.1f} s)\n", dir.string(), pending->step,
            bytes / 1048576.0, seconds);
      std::fflush(stdout);
    }
    pending.reset();
  };
  reset_peak_memory_stats(device);
  for (int64_t step = first_step; step < f.steps; ++step) {
    // Every collective of the step carries its number: hang verdicts name the step.
    tessel::fr::FlightRecorder::global().set_step(step);
    const auto step_start = Clock::now();
    const auto [x, y] = data.next_train();  // this rank's rows of the global batch
    const double loss = accumulate_gradients(*model, spec.vocab_size(), ddp.get(), x, y, f, layout,
                                             device, autocast);
    const double norm = clip_grad_norm(model->parameters(), f.clip);
    opt.set_lr(schedule.lr(step));
    opt.step();
    opt.zero_grad();
    const double step_loss = world_mean(world, loss);
    window_loss += step_loss;
    ++window_steps;
    if (json.is_open()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
      json << fmt::format(
          "{{\"step\": {}, \"loss\": {:.6f}, \"grad_norm\": {:.6f}, \"lr\": {:.6g}, "
          "\"tokens_per_s\": {:.1f}, \"peak_memory_bytes\": {}}}\n",
          step + 1, step_loss, norm, opt.lr(), tokens_per_step / seconds,
          memory_stats(device).peak_allocated_bytes);
      json.flush();
    }
    if ((step + 1) % f.log_every == 0 || step + 1 == f.steps) {
      const double seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      const double eta = elapsed / static_cast<double>(step + 1 - first_step) *
                         static_cast<double>(f.steps - step - 1);
      print(
          "step {:>5}/{} [{}] loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | "
          "ETA {}\n",
          step + 1, f.steps, progress_bar(step + 1, f.steps), window_loss / window_steps, opt.lr(),
          norm, tokens_per_step * window_steps / seconds, duration_str(eta));
      std::fflush(stdout);
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
    if (ckpt && f.checkpoint_every > 0 && (step + 1) % f.checkpoint_every == 0) {
      ckpt_state.step = step + 1;
      data.save(ckpt_state.metadata);
      report_save(true);  // async_save waits for the previous save anyway
      pending = PendingSave{ckpt->async_save(ckpt_state), step + 1, Clock::now()};
    }
    if (f.eval_every > 0 && (step + 1) % f.eval_every == 0) {
      const double val_loss =
          evaluate_during_training(*model, spec.vocab_size(), data, f, layout, device, autocast);
      print("step {:>5}/{} val loss {:.4f}\n", step + 1, f.steps, val_loss);
      if (json.is_open()) {  // a line of its own: tessel-plot's validation-loss series
        json << fmt::format("{{\"step\": {}, \"val_loss\": {:.6f}}}\n", step + 1, val_loss);
        json.flush();
      }
      std::fflush(stdout);
    }
    report_save(false);
  }
  report_save(true);
  if (ckpt) ckpt->wait();
  const double total_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  // The whole model on rank 0 (a collective when sharded) for evaluation, saving and sampling.
  std::unique_ptr<nn::Module> whole = spec.make();
  {
    const nn::StateDict state = full_state_dict(*model);
    if (!lead) return 0;
    whole->load_state_dict(state);
  }
  fmt::print(
      "trained {} steps in {:.1f} s ({:.0f} tok/s); peak memory {:.1f} MiB; val loss "
      "{:.4f} nats/byte\n",
      f.steps - first_step, total_seconds, tokens_per_step * (f.steps - first_step) / total_seconds,
      memory_stats(device).peak_allocated_bytes / 1048576.0,
      evaluate(*whole, data.validation(0, 1, f.seed + 1), f));
  whole->save(f.checkpoint, {{"steps", std::to_string(f.steps)},
                             {"config", fmt::format("layers={} heads={} embd={} context={}",
                                                    f.layers, f.heads, f.embd, f.seq)}});
  fmt::print("saved checkpoint {}\n", f.checkpoint);
  if (!f.export_hf.empty()) {
    nn::save_hf(*whole, f.export_hf);
    fmt::print("exported the model in Hugging Face format to {}\n", f.export_hf);
  }
  // Byte-level tokens (and a document separator, 256) decode as bytes; other vocabularies need
  // their tokenizer, which train_gpt does not load.
  if (f.sample > 0 && spec.vocab_size() <= 257) {
    fmt::print("sample (temperature {}):\n{}{}\n", f.temperature, f.prompt,
               generate_text(*whole, spec.context(), f, f.sample));
  }
  return 0;
}

// Combinations of flags that cannot work, and parallel flags in a process no launcher started;
// each message names the flag, its value and what would work. Throws InvalidArgument.
void check_flags(const Flags& f) {
  TESSEL_CHECK(f.embd % f.heads == 0, InvalidArgument,
               "--embd {} does not split over --heads {}: expected a multiple of {}", f.embd,
               f.heads, f.heads);
  if (f.model == "llama" && f.init_hf.empty()) {
    const int64_t kv = f.kv_heads > 0 ? f.kv_heads : f.heads;
    TESSEL_CHECK(f.heads % kv == 0, InvalidArgument,
                 "--kv-heads {}: expected a divisor of --heads {} (query heads share K/V heads)",
                 kv, f.heads);
    TESSEL_CHECK(f.embd / f.heads % 2 == 0, InvalidArgument,
                 "--embd {} over --heads {} gives heads of {}: rotary positions need an even "
                 "head size",
                 f.embd, f.heads, f.embd / f.heads);
    TESSEL_CHECK(kv % f.tp == 0, InvalidArgument,
                 "--kv-heads {} does not split over --tp {}: each tp rank runs whole K/V heads, "
                 "expected a multiple of {}",
                 kv, f.tp, f.tp);
  }
  TESSEL_CHECK(
      f.init_hf.empty() ||
          std::filesystem::is_regular_file(std::filesystem::path(f.init_hf) / "config.json"),
      InvalidArgument, "--init-hf '{}': no config.json there: expected a Hugging Face model folder",
      f.init_hf);
  TESSEL_CHECK(f.kv_heads == 0 || f.model == "llama", InvalidArgument,
               "--kv-heads {} is for --model llama (the GPT's heads are all K/V heads)",
               f.kv_heads);
  TESSEL_CHECK(f.min_lr <= f.lr, InvalidArgument,
               "--min-lr {} is above --lr {}: expected at most the peak learning rate", f.min_lr,
               f.lr);
  TESSEL_CHECK(f.dp_shard == -1 || f.dp_shard >= 1, InvalidArgument,
               "--dp-shard {}: expected -1 (every rank left) or an integer of at least 1",
               f.dp_shard);
  TESSEL_CHECK(!f.resume || !f.checkpoint_dir.empty(), InvalidArgument,
               "--resume needs --checkpoint-dir DIR: the folder to resume from");
  TESSEL_CHECK(f.checkpoint_every == 0 || !f.checkpoint_dir.empty(), InvalidArgument,
               "--checkpoint-every {} needs --checkpoint-dir DIR: the folder to save into",
               f.checkpoint_every);
  TESSEL_CHECK(
      !f.generate || f.resume, InvalidArgument,
      "--generate samples from a saved checkpoint: it needs --resume --checkpoint-dir DIR");
  TESSEL_CHECK(!f.prompt.empty(), InvalidArgument,
               "--prompt '': expected at least one byte for the model to continue");
  TESSEL_CHECK(!f.sequence_parallel || f.tp > 1, InvalidArgument,
               "--sequence-parallel splits over the tp ranks: it needs --tp 2 or more");
  if (!names_token_shards(f.data)) {
    std::ifstream data(f.data, std::ios::binary);
    TESSEL_CHECK(data.good(), InvalidArgument,
                 "--data '{}': cannot open it: expected a text file or a glob of token shards",
                 f.data);
    TESSEL_CHECK(f.val_data.empty(), InvalidArgument,
                 "--val-data '{}' goes with token shards: --data '{}' is a text file (its last "
                 "10 % validate)",
                 f.val_data, f.data);
  }
  // Files written later (at the end, or every step) must have a folder to go into.
  for (const auto& [flag, path] :
       {std::pair{"--checkpoint", &f.checkpoint}, std::pair{"--log-json", &f.log_json}}) {
    if (path->empty()) continue;
    const std::filesystem::path parent =
        std::filesystem::absolute(std::filesystem::path(*path)).parent_path();
    TESSEL_CHECK(std::filesystem::is_directory(parent), InvalidArgument,
                 "{} '{}': folder '{}' does not exist: expected a file in an existing folder", flag,
                 *path, parent.string());
  }
  TESSEL_CHECK(f.checkpoint_dir.empty() || !std::filesystem::exists(f.checkpoint_dir) ||
                   std::filesystem::is_directory(f.checkpoint_dir),
               InvalidArgument,
               "--checkpoint-dir '{}' is not a folder: expected a folder (made "
               "when missing)",
               f.checkpoint_dir);
  try {
    parse_device(f.device);
  } catch (const Error& e) {
    throw InvalidArgument(fmt::format("--device '{}': {}", f.device, e.message()));
  }
  // Parallel flags need as many processes as the mesh has ranks: one process cannot hold them.
  const int64_t ranks = f.tp * std::max<int64_t>(f.dp_shard, 1) * f.dp_replicate;
  if (ranks > 1 && read_launch_env().world_size == 1) {
    std::string flags;
    if (f.dp_replicate > 1) flags += fmt::format(" --dp-replicate {}", f.dp_replicate);
    if (f.dp_shard > 1) flags += fmt::format(" --dp-shard {}", f.dp_shard);
    if (f.tp > 1) flags += fmt::format(" --tp {}", f.tp);
    throw InvalidArgument(fmt::format(
        "{} needs {} processes, but this is one process that no launcher started: run it as "
        "tessel-run --standalone --nproc-per-node {} train_gpt{} ... (docs/launching.md)",
        flags.substr(1), ranks, ranks, flags));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"train_gpt: train a small byte-level GPT on the bundled corpus (docs/training.md)"};
  cli::show_defaults(app);
  using cli::integer_at_least;
  app.add_option("--data", f.data,
                 "text file to train on, or a glob of token shards (tessel-tokenize's)");
  app.add_option("--val-data", f.val_data,
                 "with token shards: a glob of validation shards (default: the training shards)");
  app.add_option("--grad-accum", f.grad_accum,
                 "micro-batches per step: each rank's rows of --batch run in N pieces")
      ->check(integer_at_least(1));
  app.add_option("--grad-sync", f.grad_sync,
                 "FSDP/DDP gradient communication: on the last micro-batch, or every one")
      ->check(cli::one_of({"last", "every"}));
  app.add_option("--activation-checkpointing", f.activation_checkpointing,
                 "recompute each block's activations in backward: none, full, or selective "
                 "(keep matmul and attention outputs)")
      ->check(cli::one_of({"none", "full", "selective"}));
  app.add_option("--checkpoint", f.checkpoint, "where to save the safetensors checkpoint");
  app.add_option("--steps", f.steps, "optimizer steps")->check(integer_at_least(1));
  app.add_option("--batch", f.batch, "sequences per step (the global batch, split over ranks)")
      ->check(integer_at_least(1));
  app.add_option("--seq", f.seq, "sequence length (and context size)")->check(integer_at_least(1));
  app.add_option("--layers", f.layers, "transformer blocks")->check(integer_at_least(1));
  app.add_option("--heads", f.heads, "attention heads")->check(integer_at_least(1));
  app.add_option("--embd", f.embd, "embedding width (a multiple of --heads)")
      ->check(integer_at_least(1));
  app.add_option("--model", f.model, "model: gpt or llama (with --init-hf: the folder's)")
      ->check(cli::one_of({"gpt", "llama"}));
  app.add_option("--kv-heads", f.kv_heads, "llama: key/value heads, dividing --heads (0: --heads)")
      ->check(integer_at_least(0));
  app.add_option("--init-hf", f.init_hf,
                 "start from this Hugging Face folder (its config.json sets the model)");
  app.add_option("--export-hf", f.export_hf,
                 "write the trained model to this folder in Hugging Face format at the end");
  app.add_option("--lr", f.lr, "peak learning rate")->check(cli::number_above(0));
  app.add_option("--min-lr", f.min_lr, "final learning rate (at most --lr)")
      ->check(cli::number_at_least(0));
  app.add_option("--warmup", f.warmup, "warmup steps")->check(integer_at_least(0));
  app.add_option("--weight-decay", f.weight_decay, "AdamW weight decay")
      ->check(cli::number_at_least(0));
  app.add_option("--clip", f.clip, "gradient-norm clipping threshold")->check(cli::number_above(0));
  app.add_option("--seed", f.seed, "initialisation and batch sampling seed")
      ->check(integer_at_least(0));
  app.add_option("--log-every", f.log_every, "print a progress line every N steps")
      ->check(integer_at_least(1));
  app.add_option("--eval-every", f.eval_every,
                 "print the validation loss every N steps (0: only at the end)")
      ->check(integer_at_least(0));
  app.add_option("--sample", f.sample, "bytes of text to sample at the end")
      ->check(integer_at_least(0));
  app.add_option("--temperature", f.temperature, "sampling temperature (0: greedy)")
      ->check(cli::number_at_least(0));
  app.add_flag("--generate", f.generate,
               "sample text from the latest checkpoint (--resume --checkpoint-dir) instead of "
               "training");
  app.add_option("--prompt", f.prompt, "text that the sample and --generate continue");
  app.add_option("--max-new-tokens", f.max_new_tokens, "bytes that --generate samples")
      ->check(integer_at_least(0));
  app.add_option("--top-k", f.top_k, "sample among the K most likely bytes only (0: all)")
      ->check(cli::integer_in(0, 256));
  app.add_option("--threads", f.threads, "CPU threads for tensor ops (0: one per core)")
      ->check(cli::integer_in(0, 4096));
  app.add_option("--dp-shard", f.dp_shard,
                 "ranks that shard the model with FSDP (-1: all not used by --dp-replicate, --tp)")
      ->check(integer_at_least(-1));
  app.add_option("--dp-replicate", f.dp_replicate, "replicas of the sharded model (HSDP)")
      ->check(integer_at_least(1));
  app.add_flag("--ddp", f.ddp, "replicate the model on every rank (DDP) instead of sharding it");
  app.add_option("--tp", f.tp, "tensor-parallel ranks: every layer split over them")
      ->check(integer_at_least(1));
  app.add_flag("--sequence-parallel", f.sequence_parallel,
               "with --tp, also split the norms and the residual stream by sequence");
  app.add_option("--log-json", f.log_json, "write one JSON object per step to this file");
  app.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "save distributed checkpoints under this folder (step_<N>)");
  app.add_option("--checkpoint-every", f.checkpoint_every, "steps between checkpoints (0: none)")
      ->check(integer_at_least(0));
  app.add_option("--keep-checkpoints", f.keep_checkpoints, "committed checkpoints to keep (0: all)")
      ->check(cli::integer_in(0, 1000000));
  app.add_flag("--resume", f.resume,
               "continue from the latest checkpoint under --checkpoint-dir (if there is one)");
  app.add_option("--device", f.device,
                 "where to train: cpu, cuda (cuda:LOCAL_RANK under a launcher) or cuda:N");
  app.add_option("--autocast", f.autocast,
                 "bf16 mixed precision for forward and loss (auto: on for CUDA devices)")
      ->check(cli::one_of({"auto", "bf16", "off"}));
  cli::describe_options(app);
  if (const auto status = cli::parse(app, argc, argv, "train_gpt")) return *status;
  f.model_given = app.count("--model") > 0;
  try {
    check_flags(f);
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.message());
    return cli::kExitBadValue;
  }
  try {
    return run(f);
  } catch (const tessel::Timeout& e) {
    // A collective timed out: its peers hang. 124 is the status tessel-run (and
    // docs/diagnosing-hangs.md) reads as "a collective timed out"; the dumps are written.
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 124;
  } catch (const tessel::InvalidArgument& e) {  // a mesh the launched ranks do not fill, ...
    fmt::print(stderr, "train_gpt: {}\n", e.message());
    return cli::kExitBadValue;
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 1;
  }
}
