// GPT pipeline stages: the layers of one stage under the whole model's names.
#include "tessel/parallel/pp/gpt_stage.h"

#include <string>

#include "tessel/base/error.h"
#include "tessel/parallel/pp/internal/stage_build.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/ops.h"

namespace tessel::pp {
using internal::shared_child;

GptStage::GptStage(std::shared_ptr<nn::GPT> model, int stage, int first_block, int num_blocks,
                   bool with_embedding, bool with_head)
    : Module("GptStage"),
      model_(std::move(model)),
      stage_(stage),
      first_block_(first_block),
      num_blocks_(num_blocks),
      with_embedding_(with_embedding),
      with_head_(with_head) {
  TESSEL_CHECK(model_ != nullptr && first_block >= 0 && num_blocks >= 0 &&
                   first_block + num_blocks <= model_->config().n_layer,
               InvalidArgument, "GptStage {}: blocks [{}, {}) outside the model's {} blocks", stage,
               first_block, first_block + num_blocks,
               model_ ? model_->config().n_layer : int64_t{0});
  Module& whole = model_->child("transformer");
  auto transformer = register_module("transformer", std::make_shared<Module>("ModuleDict"));
  // The head's weight is the token embedding's (tied), so the last stage holds wte too.
  if (with_embedding || with_head) transformer->register_module("wte", shared_child(whole, "wte"));
  if (with_embedding) {
    transformer->register_module("wpe", shared_child(whole, "wpe"));
    transformer->register_module("drop", shared_child(whole, "drop"));
  }
  auto h = transformer->register_module("h", std::make_shared<Module>("ModuleDict"));
  for (int l = first_block; l < first_block + num_blocks; ++l) {
    const std::string name = std::to_string(l);
    h->register_module(name, shared_child(whole.child("h"), name));
  }
  if (with_head) transformer->register_module("ln_f", shared_child(whole, "ln_f"));
}

Tensor GptStage::forward(const Tensor& input) {
  Module& transformer = child("transformer");
  Tensor x = input;
  if (with_embedding_) {
    const int64_t block_size = model_->config().block_size;
    TESSEL_CHECK(input.dim() == 2 && !is_floating(input.dtype()) && input.size(1) > 0 &&
                     input.size(1) <= block_size,
                 InvalidArgument,
                 "GPT stage {} expects integer tokens (B, T) with 0 < T <= block_size {}, got {}",
                 stage_, block_size, input.str());
    const int64_t T = input.size(1);
    x = add(transformer.child("wte")(input),
            transformer.child("wpe")(arange(T, DType::kI64, input.device())));
    x = transformer.child("drop")(x);
  }
  Module& h = transformer.child("h");
  for (int l = first_block_; l < first_block_ + num_blocks_; ++l) x = h.child(std::to_string(l))(x);
  if (with_head_) {
    x = linear(transformer.child("ln_f")(x), parameter("transformer.wte.weight"));
  }
  return x;
}

std::vector<std::shared_ptr<GptStage>> make_gpt_stages(const nn::GptConfig& config,
                                                       const std::vector<int>& layout, int rank,
                                                       int num_ranks, Device device) {
  return internal::build_stages<GptStage, nn::GPT>(config, static_cast<int>(config.n_layer), layout,
                                                   rank, num_ranks, device, "GPT");
}

ParallelizePlan gpt_stage_tp_plan(const GptStage& stage, const GptTpOptions& options) {
  TESSEL_CHECK(!options.sequence_parallel, InvalidArgument,
               "gpt_stage_tp_plan: sequence parallelism across pipeline stages is not supported "
               "yet (stage {} would send sequence shards)",
               stage.stage());
  const nn::Module& transformer = stage.child("transformer");
  auto holds = [&](std::string_view name) {
    for (const auto& [child_name, child] : transformer.children()) {
      if (child_name == name) return true;
    }
    return false;
  };
  ParallelizePlan plan;
  for (auto& [path, style] : gpt_tp_plan(options)) {
    // "transformer.<child>..." with <child> "h" for the blocks.
    const std::string_view rest =
        std::string_view(path).substr(std::string_view("transformer.").size());
    const std::string_view child = rest.substr(0, rest.find('.'));
    const bool keep = child == "h" ? stage.num_blocks() > 0 : holds(child);
    if (keep) plan.emplace_back(path, style);
  }
  return plan;
}

std::vector<std::string> gpt_tied_parameters() { return {"transformer.wte.weight"}; }

}  // namespace tessel::pp
