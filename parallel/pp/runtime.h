#pragma once
// The pipeline runtime: runs one rank's list of a validated PipelineSchedule (schedule.h) over
// the stages this rank holds, moving activations and gradients between ranks point to point.
//
//   auto stages = pp::make_gpt_stages(cfg, pp::uniform_layout(cfg.n_layer, 2), pg->rank(), 2);
//   std::vector<pp::LocalStage> local;
//   for (auto& s : stages) local.push_back({s->stage(), s});
//   nn::optim::AdamW* opt = nullptr;
//   pp::PipelineRuntime runtime(pg, pp::make_1f1b(2, 4), local, nn::GPT::loss,
//                               {.on_step = [&] { opt->step(); },
//                                .tied_parameters = pp::gpt_tied_parameters()});
//   nn::optim::AdamW adamw(runtime.parameters(), {...});
//   opt = &adamw;
//   double loss = runtime.step(tokens, targets);   // the whole batch's mean loss, every rank
//
// Per step: the global batch (dim 0) is cut into the schedule's m micro-batches; the last
// stage's loss of micro-batch i is scaled by 1/m, so the gradients accumulated over the step are
// the full batch's mean-loss gradients when micro-batches are the same size. Gradients of
// parameters several stages hold (a tied embedding) are summed over their ranks at STEP, then
// PipelineOptions::on_step runs (clipping with pp::clip_grad_norm, the optimizer).
//
// Transport. Each direction of each pair of neighbouring ranks gets its own two-rank group, one
// for activations and one for gradients, split from the pipeline group at construction. On such
// a group one rank only sends and the other only receives, in the order the validator checked,
// so sends never wait behind receives: sends are asynchronous (waited at STEP), and from the
// second step on each receive is posted up to recv_lookahead receives before its action needs
// it. Shapes are agreed once: the first message of each stage boundary and direction carries
// the tensor's dtype and shape; receive buffers are allocated once per boundary and reused.
//
// The backward split (B then W, zero-bubble schedules): B runs the stage's backward under a
// DeferWeightGradsGuard (tensor/deferred_grad.h), so linear layers (attention and MLP
// projections, the LM head) compute their input gradients and queue their weight and bias
// gradients; W computes those and accumulates them, then releases the micro-batch's saved state.
// Embeddings and norms still get their (cheap) weight gradients in B. FSDP and DDP stages, and
// defer_weight_gradients = false, run the whole backward in B (W then only releases): their
// gradient communication wants each gradient complete within one backward pass.
//
// Data parallelism inside stages: fully_shard over dp_shard, or over a (dp_replicate, dp_shard)
// mesh (HSDP), before the runtime is made; or replicate() (DDP) with the handle in LocalStage.
// Either way a stage's gradients are communicated once per step, in its last backward.
//
// Thread-safety: one thread per rank calls step(). Ownership: the runtime shares the stage
// modules and the groups.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/process_group.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/pp/schedule.h"

namespace tessel {
class DDPModule;  // tessel/parallel/fsdp/ddp.h
}  // namespace tessel

namespace tessel::pp {

// A stage this rank runs: its index in the pipeline (s % p == rank) and its module. The module
// maps the previous stage's output (stage 0: the micro-batch's inputs) to its own output (the
// last stage: what the loss reads). `ddp`: the handle replicate() returned for the module when
// the stage is replicated over data-parallel ranks (DDP); the runtime then averages its
// gradients once per step, in the stage's last backward, and runs its whole backward in B.
struct LocalStage {
  int stage = 0;
  std::shared_ptr<nn::Module> module;
  std::shared_ptr<DDPModule> ddp = nullptr;
};

// The loss of one micro-batch: (last stage's output, targets) -> a scalar mean.
using PipelineLoss = std::function<Tensor(const Tensor& output, const Tensor& targets)>;

struct PipelineOptions {
  // Runs at the schedule's STEP, once gradients are complete and tied ones summed.
  std::function<void()> on_step = {};
  // Parameters (dotted names) that more than one stage holds, such as an LM head tied to the
  // embedding. Their gradients are summed over the ranks holding them before on_step; stages of
  // one rank must share the tensor.
  std::vector<std::string> tied_parameters = {};
  // How many receives ahead of their action are posted (from the second step on). 0: none.
  int recv_lookahead = 2;
  // Per point-to-point call; 0: the group's default.
  Nanoseconds timeout{0};
  // Stages under fully_shard (over dp_shard, or (dp_replicate, dp_shard) for HSDP, applied
  // before the runtime is made): true gathers each stage's parameters once per step for all its
  // micro-batches (issued at the start of the step, freed after the stage's last backward); false
  // gathers them per micro-batch as FSDP does by default (less memory, more all_gathers). Either
  // way the gradients accumulate unsharded and are reduce-scattered once per step, in the stage's
  // last backward.
  bool fsdp_gather_once_per_step = true;
  // Zero-bubble schedules (B and W actions): B computes input gradients only and W the linear
  // layers' weight gradients. false: B runs the whole backward, W only frees saved state.
  // Stages under fully_shard or replicate always run the whole backward in B.
  bool defer_weight_gradients = true;
  // For tests only: fault injection (tests/parallel/pp_hang_test.cc) and a modeled clock per
  // action (pp_bubble_memory_test.cc); leave both unset in a real run. before_action runs before
  // each action of step(), on its thread (it may block, as a stage stuck in compute does);
  // returning false skips the action.
  // check_schedule_agreement = false skips the constructor's check that every rank runs the
  // same schedule, so a test can run ranks whose micro-batch counts differ.
  std::function<bool(const Action&)> before_action = {};
  bool check_schedule_agreement = true;
};

// What the runtime has done, for tests and logs.
struct PipelineStats {
  int steps = 0;
  // Per local stage (in LocalStage order): the most micro-batches whose forward state (input,
  // graph) the stage held at once. Over all local stages together: peak_in_flight_rank.
  std::vector<int> peak_in_flight;
  int peak_in_flight_rank = 0;
  int64_t sends = 0;
  int64_t recvs = 0;
  int64_t recvs_posted_early = 0;  // receives issued before their action
  int64_t buffers_allocated = 0;   // receive buffers ever allocated (reused afterwards)
  // Weight-gradient computations B actions left to their W (one per linear layer and
  // micro-batch; 0 without B/W actions).
  int64_t weight_grads_deferred = 0;
};

class PipelineRuntime {
 public:
  // Collective over `group` (the pipeline group, p = schedule.num_ranks ranks): checks the
  // schedule (validate_schedule; the same verdict on every rank), that every rank runs the same
  // schedule (an all_gather of its hash), that `stages` are exactly the stages the schedule puts
  // on this rank, then splits the point-to-point groups. Throws InvalidArgument naming the
  // problem — a malformed schedule names the rank, the action and why, on every rank.
  PipelineRuntime(std::shared_ptr<ProcessGroup> group, PipelineSchedule schedule,
                  std::vector<LocalStage> stages, PipelineLoss loss, PipelineOptions options = {});
  ~PipelineRuntime();
  PipelineRuntime(const PipelineRuntime&) = delete;
  PipelineRuntime& operator=(const PipelineRuntime&) = delete;

  // One training step over the global batch: zeroes the local stages' gradients, runs this
  // rank's actions in order, and returns the batch's mean loss on every rank (a broadcast from
  // the last stage's rank). `inputs` is read on the rank of stage 0 and `targets` on the rank of
  // the last stage (others may pass undefined tensors); dim 0 is the batch and must divide by m,
  // checked on every rank that is given them (InvalidArgument otherwise, before anything is
  // sent: pass the batch on every rank and every rank fails alike). Blocking; every rank of the
  // group calls it.
  double step(const Tensor& inputs, const Tensor& targets);

  // The local stages' parameters, each tensor once (what the optimizer updates).
  std::vector<Tensor> parameters() const;
  // The same with dotted names (the stages use the whole model's names).
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // The parameters whose gradients count toward the global norm on this rank: parameters()
  // less the tied copies another rank counts.
  std::vector<Tensor> norm_parameters() const;

  const PipelineSchedule& schedule() const { return schedule_; }
  const std::vector<LocalStage>& stages() const { return stages_; }
  const PipelineStats& stats() const { return stats_; }
  ProcessGroup& group() const { return *group_; }

 private:
  struct Impl;
  std::shared_ptr<ProcessGroup> group_;
  PipelineSchedule schedule_;
  std::vector<LocalStage> stages_;
  PipelineStats stats_;
  std::unique_ptr<Impl> impl_;
};

// Gradient clipping by the global norm over every stage of the pipeline: each rank's sum of
// squares over norm_parameters() (shards summed over their mesh dimensions, as
// tessel::clip_grad_norm does), all-reduced over the pipeline group, then every gradient scaled
// as nn::optim::clip_grad_norm does. Returns the norm. Collective over the group: call it
// on every rank (from on_step).
double clip_grad_norm(PipelineRuntime& runtime, double max_norm);

}  // namespace tessel::pp
