#include "moe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/base/tools/cli.h"
#include "tessel/parallel/fsdp/fsdp.h"

namespace tessel::train_gpt {

void add_moe_flags(CLI::App& app, Flags& f) {
  app.add_option("--experts", f.experts, "llama-moe: routed experts in each MoE layer")
      ->check(cli::integer_at_least(1));
  app.add_option("--experts-top-k", f.experts_top_k, "llama-moe: experts each token is routed to")
      ->check(cli::integer_at_least(1));
  app.add_option("--ep", f.ep,
                 "llama-moe: expert-parallel ranks (dividing --dp-shard and --experts): each "
                 "holds experts / ep")
      ->check(cli::integer_at_least(1));
}

nn::LlamaMoEConfig moe_config(const Flags& f) {
  nn::LlamaMoEConfig m = *nn::LlamaConfig::tiny_moe().moe;
  m.num_experts = f.experts;
  m.top_k = f.experts_top_k;
  m.hidden_dim = f.embd;
  return m;
}

void check_moe_flags(const Flags& f) {
  if (f.model != "llama-moe") {
    TESSEL_CHECK(f.ep == 1, InvalidArgument,
                 "--ep {} shards the experts of --model llama-moe; --model {} has none", f.ep,
                 f.model);
    return;
  }
  TESSEL_CHECK(f.experts_top_k <= f.experts, InvalidArgument,
               "--experts-top-k {} is above --experts {}: a token picks among the experts",
               f.experts_top_k, f.experts);
  TESSEL_CHECK(f.experts % f.ep == 0, InvalidArgument,
               "--experts {} do not divide over --ep {}: each ep rank holds experts / ep",
               f.experts, f.ep);
  TESSEL_CHECK(f.tp == 1 && !f.ddp && f.dp_replicate == 1, InvalidArgument,
               "--model llama-moe trains under FSDP (--dp-shard, with --ep carved from it); "
               "--tp, --ddp and --dp-replicate do not apply to it yet");
  TESSEL_CHECK(f.init_hf.empty(), InvalidArgument,
               "--init-hf does not load MoE folders yet: --model llama-moe starts from scratch");
}

std::shared_ptr<ExpertParallel> parallelize_moe(nn::Module& model, const Flags& f,
                                                const Layout& l) {
  // Under data parallelism even ep 1 installs the dispatcher: it sums the per-expert counts over
  // the ranks, so that routing and the balancing bias are one process's (and equal everywhere).
  if (!l.mesh || f.model != "llama-moe") return nullptr;
  const DeviceMesh moe_mesh = carve_ep_mesh(*l.mesh, f.ep);  // (dp_replicate, efsdp, ep)
  auto ep = std::make_shared<ExpertParallel>(
      parallelize_experts(model, moe_mesh, {.data_dims = {"efsdp", "ep"}}));
  for (nn::MoE* moe : ep->layers()) fully_shard(moe->child("experts"), moe_mesh["efsdp"]);
  if (l.world->rank() == 0 && f.ep > 1) {
    fmt::print("expert parallel: ep {} x efsdp {}, {} experts per rank, ep groups of ranks {}\n",
               f.ep, moe_mesh.size("efsdp"), f.experts / f.ep,
               fmt::join(moe_mesh["ep"].ranks(), "+"));
  }
  return ep;
}

std::unique_ptr<MoELog> MoELog::attach(nn::Module& model, std::shared_ptr<ExpertParallel> ep) {
  auto* llama = dynamic_cast<nn::Llama*>(&model);
  if (llama == nullptr || !llama->config().moe) return nullptr;
  auto log = std::make_unique<MoELog>();
  log->layers_ = llama->moe_layers();
  log->ep_ = std::move(ep);
  return log;
}

void MoELog::after_step() {
  counts_.clear();
  for (nn::MoE* moe : layers_) {
    moe->update_expert_bias();
    counts_.push_back(moe->expert_counts());
  }
}

std::string MoELog::json_fields() {
  std::vector<std::string> counts, imbalance;
  for (const auto& c : counts_) {
    counts.push_back(fmt::format("[{}]", fmt::join(c, ", ")));
    imbalance.push_back(fmt::format("{:.4f}", nn::load_imbalance(c)));
  }
  std::string s = fmt::format(", \"moe_counts\": [{}], \"moe_imbalance\": [{}]",
                              fmt::join(counts, ", "), fmt::join(imbalance, ", "));
  if (ep_) {
    s += fmt::format(", \"all_to_all_s\": {:.6f}", ep_->stats().all_to_all_time.count());
    ep_->reset_stats();
  }
  return s;
}

std::string MoELog::log_str() const {
  double worst = 0;
  for (const auto& c : counts_) worst = std::max(worst, nn::load_imbalance(c));
  return fmt::format(" | experts max/mean {:.2f}", worst);
}

}  // namespace tessel::train_gpt
