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
//
// Pipeline parallelism: --pp N splits the GPT into stages over N ranks (FSDP over the rest),
// --pp-schedule gpipe|1f1b|interleaved-1f1b|zero-bubble, --microbatches M, --pp-virtual-stages V,
// --pp-layout uniform|balanced|2,1,1,2 (pipeline.h; no checkpoints, eval or sample yet):
//
//   tessel-run --standalone --nproc-per-node 4 build/release/examples/train_gpt --threads 1
//       --layers 4 --pp 2 --pp-schedule interleaved-1f1b --microbatches 4   (one command line)
//
// The program's parts: flags.h (the command line), data.h (what it trains on), layout.h (the
// device, the world and the mesh), model.h (the model and how it is parallelised), train.h (the
// run), pipeline.h (the run with --pp) and generate.h (text from a model).

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "flags.h"
#include "pipeline.h"
#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"
#include "train.h"

int main(int argc, char** argv) {
  tessel::train_gpt::Flags f;
  CLI::App app{"train_gpt: train a small byte-level GPT on the bundled corpus (docs/training.md)"};
  tessel::cli::show_defaults(app);
  tessel::train_gpt::add_flags(app, f);
  tessel::train_gpt::PipelineFlags pipeline;
  tessel::train_gpt::add_pipeline_flags(app, pipeline);
  tessel::cli::describe_options(app);
  if (const auto status = tessel::cli::parse(app, argc, argv, "train_gpt")) return *status;
  f.model_given = app.count("--model") > 0;
  try {
    tessel::train_gpt::check_flags(f);
    tessel::train_gpt::check_pipeline_flags(f, pipeline);
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.message());
    return tessel::cli::kExitBadValue;
  }
  try {
    if (pipeline.pp > 1) return tessel::train_gpt::run_pipeline(f, pipeline);
    return tessel::train_gpt::run(f);
  } catch (const tessel::Timeout& e) {
    // A collective timed out: its peers hang. 124 is the status tessel-run (and
    // docs/diagnosing-hangs.md) reads as "a collective timed out"; the dumps are written.
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 124;
  } catch (const tessel::InvalidArgument& e) {  // a mesh the launched ranks do not fill, ...
    fmt::print(stderr, "train_gpt: {}\n", e.message());
    return tessel::cli::kExitBadValue;
  } catch (const tessel::Error& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 1;
  }
}
