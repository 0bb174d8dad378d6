#include "flags.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "cp.h"
#include "data.h"
#include "moe.h"
#include "tessel/base/error.h"
#include "tessel/base/launch_env.h"
#include "tessel/base/tools/cli.h"
#include "tessel/tensor/device.h"

namespace tessel::train_gpt {

void add_flags(CLI::App& app, Flags& f) {
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
  app.add_option("--model", f.model,
                 "model: gpt, llama or llama-moe (with --init-hf: the folder's)")
      ->check(cli::one_of({"gpt", "llama", "llama-moe"}));
  add_moe_flags(app, f);
  app.add_option("--kv-heads", f.kv_heads, "llama: key/value heads, dividing --heads (0: --heads)")
      ->check(integer_at_least(0));
  app.add_flag("--tie-embeddings", f.tie_embeddings,
               "llama: the LM head shares the token embedding's weight");
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
  add_cp_flags(app, f);
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
}

std::string model_config_str(const Flags& f) {
  std::string s =
      fmt::format("layers={} heads={} embd={} context={}", f.layers, f.heads, f.embd, f.seq);
  if (f.model != "gpt") s += fmt::format(" model={} kv_heads={}", f.model, f.kv_heads);
  if (f.tie_embeddings) s += " tied";
  if (f.model == "llama-moe") s += fmt::format(" experts={} top_k={}", f.experts, f.experts_top_k);
  if (!f.init_hf.empty()) s += " init_hf=" + f.init_hf;
  return s;
}

void check_flags(const Flags& f) {
  TESSEL_CHECK(!f.tie_embeddings || (f.model == "llama" && f.init_hf.empty()), InvalidArgument,
               "--tie-embeddings applies to --model llama without --init-hf (the GPT always "
               "ties; a Hugging Face folder's config.json says)");
  TESSEL_CHECK(f.embd % f.heads == 0, InvalidArgument,
               "--embd {} does not split over --heads {}: expected a multiple of {}", f.embd,
               f.heads, f.heads);
  if (f.model != "gpt" && f.init_hf.empty()) {
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
  TESSEL_CHECK(f.kv_heads == 0 || f.model != "gpt", InvalidArgument,
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
  check_moe_flags(f);
  check_cp_flags(f);
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
  const int64_t ranks = f.tp * f.cp * std::max<int64_t>(f.dp_shard, 1) * f.dp_replicate;
  if (ranks > 1 && read_launch_env().world_size == 1) {
    std::string flags;
    if (f.dp_replicate > 1) flags += fmt::format(" --dp-replicate {}", f.dp_replicate);
    if (f.dp_shard > 1) flags += fmt::format(" --dp-shard {}", f.dp_shard);
    if (f.cp > 1) flags += fmt::format(" --cp {}", f.cp);
    if (f.tp > 1) flags += fmt::format(" --tp {}", f.tp);
    throw InvalidArgument(fmt::format(
        "{} needs {} processes, but this is one process that no launcher started: run it as "
        "tessel-run --standalone --nproc-per-node {} train_gpt{} ... (docs/launching.md)",
        flags.substr(1), ranks, ranks, flags));
  }
}

}  // namespace tessel::train_gpt
