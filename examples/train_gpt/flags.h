// train_gpt's command line: the flags, their registration and the checks of combinations
// that cannot work (examples/train_gpt/main.cc has the program's usage).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace tessel::train_gpt {

struct Flags {
  std::string data = TESSEL_EXAMPLES_DATA_DIR "/corpus.txt";
  std::string checkpoint = "train_gpt.safetensors";
  int64_t steps = 400;
  int64_t batch = 16;
  int64_t seq = 64;
  int64_t layers = 3;
  int64_t heads = 4;
  int64_t embd = 96;
  std::string model = "gpt";    // gpt, llama or llama-moe
  int64_t kv_heads = 0;         // llama: K/V heads (0: --heads)
  bool tie_embeddings = false;  // llama: the LM head shares the token embedding
  int64_t experts = 8;          // llama-moe: routed experts per MoE layer (moe.h)
  int64_t experts_top_k = 2;    // llama-moe: experts per token
  int64_t ep = 1;               // llama-moe: expert-parallel ranks, carved from --dp-shard
  std::string init_hf;          // start from this Hugging Face folder
  std::string export_hf;        // write the trained model here in Hugging Face's format
  bool model_given = false;     // --model was on the command line (--init-hf's config must agree)
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
  int64_t cp = 1;            // context-parallel ranks (each sequence split over them; cp.h)
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

// Registers every flag of `f` on `app`, with its help text and range check.
void add_flags(CLI::App& app, Flags& f);

// Combinations of flags that cannot work, and parallel flags in a process no launcher started;
// each message names the flag, its value and what would work. Throws InvalidArgument.
void check_flags(const Flags& f);

// The model flags as a checkpoint records them: "layers=3 heads=4 embd=96 context=64".
std::string model_config_str(const Flags& f);

}  // namespace tessel::train_gpt
