#pragma once
// A GPT (nn/gpt.h) split into pipeline stages by a layout (stage_layout.h): stage 0 holds the
// embeddings and its blocks, the middle stages their blocks, the last stage its blocks, the
// final LayerNorm and the LM head. Parameter names are the whole model's
// ("transformer.h.3.attn.c_attn.weight"), so a stage's state dict is a slice of the model's and
// checkpoints reshard across pipeline degrees.
//
//   auto stages = pp::make_gpt_stages(cfg, pp::uniform_layout(cfg.n_layer, 4), rank, 2);
//   // rank 1 of 2 ranks with 4 stages (2 virtual per rank) gets stages 1 and 3.
//
// The LM head is tied to the token embedding: the last stage holds its own copy of
// "transformer.wte.weight" (the same initial values), and the runtime sums the two copies'
// gradients before the step (PipelineOptions::tied_parameters = gpt_tied_parameters()), so both
// stay equal. When stage 0 and the last stage share a rank they share the tensor.
//
// Thread-safety and ownership: as nn::Module.

#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/gpt.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/tp/gpt_plan.h"
#include "tessel/tensor/device.h"

namespace tessel::pp {

class GptStage : public nn::Module {
 public:
  // A stage of `model` (whose modules it shares) holding blocks [first_block, first_block +
  // num_blocks); with_embedding / with_head say whether it is the first / last stage.
  GptStage(std::shared_ptr<nn::GPT> model, int stage, int first_block, int num_blocks,
           bool with_embedding, bool with_head);
  // First stage: tokens (B, T) -> hidden (B, T, C); middle: hidden -> hidden; last: -> logits
  // (B, T, V). A stage that is first and last is the whole model.
  Tensor forward(const Tensor& input) override;

  int stage() const { return stage_; }
  int first_block() const { return first_block_; }
  int num_blocks() const { return num_blocks_; }

 private:
  std::shared_ptr<nn::GPT> model_;  // keeps the generator the layers point to
  int stage_;
  int first_block_;
  int num_blocks_;
  bool with_embedding_;
  bool with_head_;
};

// The stages rank `rank` of `num_ranks` runs (stage s on rank s % num_ranks, as
// PipelineSchedule lays them out), in stage order, for a GPT of `config` split by `layout`
// (layout.size() stages, a multiple of num_ranks; check_layout's rules). The model is built on
// the meta device; only this rank's layers get memory on `device`, initialised to exactly the
// values the whole model's would have. Throws InvalidArgument for a bad layout or rank.
std::vector<std::shared_ptr<GptStage>> make_gpt_stages(const nn::GptConfig& config,
                                                       const std::vector<int>& layout, int rank,
                                                       int num_ranks,
                                                       Device device = Device::cpu());

// The tensor-parallel plan of one stage: gpt_tp_plan's entries for the modules the stage holds
// (the embeddings on stage 0, the blocks, ln_f on the last stage; the last stage's copy of wte is
// split by vocabulary as the whole model's is, so its logits come out split and the loss is
// loss_parallel_cross_entropy). Apply it with parallelize_module(*stage, mesh["tp"], plan)
// before making the runtime. Throws InvalidArgument for sequence parallelism (a stage boundary
// would carry sequence shards; not supported yet).
ParallelizePlan gpt_stage_tp_plan(const GptStage& stage, const GptTpOptions& options = {});

// The parameters shared by stage 0 and the last stage: {"transformer.wte.weight"}.
std::vector<std::string> gpt_tied_parameters();

}  // namespace tessel::pp
