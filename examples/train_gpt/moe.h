// train_gpt's mixture of experts: --model llama-moe (a Llama whose layers after the first are
// MoE), expert parallelism over --ep ranks carved from --dp-shard, and the experts' load
// statistics of every step (--log-json fields and the printed imbalance).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "flags.h"
#include "layout.h"
#include "tessel/nn/llama.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/ep/expert_parallel.h"

namespace tessel::train_gpt {

// --experts, --experts-top-k and --ep.
void add_moe_flags(CLI::App& app, Flags& f);

// The MoE part of --model llama-moe: --experts experts of hidden --embd, --experts-top-k per
// token, sigmoid scores normalised over the k, one shared expert, the first layer dense,
// DeepSeek's bias balancing and a small aux loss (LlamaConfig::tiny_moe's router).
nn::LlamaMoEConfig moe_config(const Flags& f);

// --ep's checks that need no mesh: llama-moe only, no --ddp / --tp / --dp-replicate, the
// experts dividing over ep. Throws InvalidArgument naming the flag.
void check_moe_flags(const Flags& f);

// Expert parallelism over --ep ranks of dp_shard (before FSDP; with ep 1 only the per-expert
// counts are summed over the ranks), and FSDP of the experts over what is left (efsdp); null in
// one process or for a model without MoE layers.
std::shared_ptr<ExpertParallel> parallelize_moe(nn::Module& model, const Flags& f, const Layout& l);

// The MoE layers' statistics of each step, for the log. Every rank calls after_step().
class MoELog {
 public:
  // Null when `model` is not an MoE Llama.
  static std::unique_ptr<MoELog> attach(nn::Module& model, std::shared_ptr<ExpertParallel> ep);
  // After the optimizer step: moves the balancing bias from the step's (whole-batch) counts and
  // records them.
  void after_step();
  // ", \"moe_counts\": [[...], ...], \"moe_imbalance\": [...], \"all_to_all_s\": x" for the
  // step's JSON line (per MoE layer; all-to-all time since the last line).
  std::string json_fields();
  // " | experts max/mean 1.23" (the worst layer's) for the progress line.
  std::string log_str() const;

 private:
  std::vector<nn::MoE*> layers_;
  std::shared_ptr<ExpertParallel> ep_;
  std::vector<std::vector<int64_t>> counts_;  // the last step's, per layer
};

}  // namespace tessel::train_gpt
