#pragma once
// Mixture of experts: the feed-forward layer of a DeepSeek/Qwen-MoE-style decoder. A router
// picks k of E SwiGLU experts per token, the experts run as grouped matmuls over the tokens
// sorted by expert, and their outputs are combined weighted by the router's scores.
//
//   MoE moe({.dim = 64, .hidden_dim = 32, .num_experts = 8, .top_k = 2});
//   Tensors out = moe(Tensors{x});                    // {y (..., C), aux_loss ()}
//   moe.expert_counts();                         // tokens per expert of that forward
//   moe.update_expert_bias();                    // aux-loss-free balancing, after the step
//
// Routing, dispatch and expert compute are three pieces (Megatron's split): route() chooses,
// an MoEDispatcher (expert parallelism's, parallel/ep/) moves the rows to the ranks holding
// their experts and back, and the grouped matmuls run whatever experts this rank holds.

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/nn/module.h"
#include "tessel/tensor/random.h"

namespace tessel::nn {

enum class MoEScore { kSoftmax, kSigmoid };

struct MoEOptions {
  int64_t dim = 0;         // C, the model's hidden size
  int64_t hidden_dim = 0;  // F, each expert's SwiGLU hidden size
  int64_t num_experts = 0;
  int64_t top_k = 1;
  MoEScore score = MoEScore::kSoftmax;
  bool norm_topk = true;     // the k weights of a token divided by their sum
  double route_scale = 1.0;  // the combine weights times this (DeepSeek-V3: 2.5)
  // Shared experts: one dense SwiGLU MLP of hidden size shared_experts * hidden_dim whose
  // output is added to every token's (0: none).
  int64_t shared_experts = 0;
  // DeepSeek's auxiliary-loss-free balancing: a per-expert bias added to the scores for the
  // choice of experts only (never to the combine weights); update_expert_bias() moves it by this
  // step against the load of the last forward. 0: no bias.
  double bias_update_speed = 0.0;
  // Switch/GShard's auxiliary loss E * sum_e f_e P_e, times this, returned by forward (0: the
  // returned loss is a zero scalar without history).
  double aux_loss_coeff = 0.0;
  // Dropless when 0: every token's k assignments run. Otherwise each expert takes at most
  // ceil(capacity_factor * tokens * k / E) assignments, in token order; the rest are dropped
  // (they add nothing to the token's output).
  double capacity_factor = 0.0;
};

// The path of the routed rows between the router and the experts (Megatron's token dispatcher).
// Expert parallelism installs one (parallel/ep/expert_parallel.h) that sends each expert's rows
// to the rank holding it; without one every expert is local. Every call below is collective over
// the dispatcher's groups: every rank runs the same layers' forwards and backwards in the same
// order. Thread-safety: used by the thread running the model.
class MoEDispatcher {
 public:
  virtual ~MoEDispatcher() = default;
  // The per-expert assignment counts of this forward summed over every rank holding other
  // tokens (the data-parallel ranks): what one process running the whole batch would count.
  virtual std::vector<int64_t> global_counts(const std::vector<int64_t>& local) = 0;
  // xs (M, C): this rank's assignments sorted by expert, counts[e] rows for each of the E
  // experts -> the rows this rank's experts process, sorted by local expert (within one, by
  // source rank, then as sent), with *offsets set to the local experts' row offsets (local
  // experts + 1 entries). Differentiable in xs.
  virtual Tensor dispatch(const Tensor& xs, const std::vector<int64_t>& counts,
                          std::vector<int64_t>* offsets) = 0;
  // The inverse of the last dispatch: ys (its rows, one output per row) -> (M, C) in xs's order.
  // Differentiable in ys.
  virtual Tensor combine(const Tensor& ys) = 0;
  // Factor on the gradients of the experts' weights (expert parallelism: 1 / ep, because the
  // all-to-all already sums the ep ranks' contributions that data parallelism averages).
  virtual double expert_grad_scale() const { return 1.0; }
};

// The routed experts of an MoE layer as one module, so that wrappers hooked on modules (FSDP's
// gathers, activation checkpointing) see their forward: parameters "gate_proj" (G, C, F),
// "up_proj" (G, C, F) and "down_proj" (G, F, C) stacked over the G experts this rank holds.
// Thread-safety and ownership: as Module.
class GroupedExperts : public Module {
 public:
  GroupedExperts(int64_t num_experts, int64_t dim, int64_t hidden_dim, Generator* gen = nullptr);
  // {xs (M, C), offsets (G + 1) i64 on the CPU} -> {ys (M, C)}: rows offsets[g]..offsets[g+1]
  // through expert g's SwiGLU, three kernels::grouped_matmul calls. Throws InvalidArgument for
  // other shapes.
  Tensors forward_multi(const Tensors& inputs) override;
  // The weights' gradients are multiplied by this (MoEDispatcher::expert_grad_scale).
  void set_grad_scale(double scale) { grad_scale_ = scale; }

 private:
  double grad_scale_ = 1.0;
};

// max / mean of per-expert counts: 1 when perfectly balanced, E when one expert takes every
// token; 0 for no counts or no tokens.
double load_imbalance(const std::vector<int64_t>& counts);

// The routed layer. Submodules and parameters, in DeepSeek's names: "gate" (Linear (E, C), no
// bias), "experts" (GroupedExperts: "experts.gate_proj" (E, C, F), "experts.up_proj" (E, C, F),
// "experts.down_proj" (E, F, C) stacked so each is one [E, K, N] operand of
// kernels::grouped_matmul), and with
// shared experts "shared_experts" (a LlamaMLP). The balancing bias is the buffer
// "expert_bias" (E) in f32. Routing runs on the host (the token order is read back), so a CUDA
// tensor syncs once per forward. Thread-safety and ownership: as Module; expert_counts() is the
// last forward's.
class MoE : public Module {
 public:
  // Throws InvalidArgument naming the value for non-positive sizes, top_k <= 0 or top_k >
  // num_experts, or a negative capacity factor, bias step or aux coefficient.
  explicit MoE(const MoEOptions& options, Generator* gen = nullptr);
  // {x (..., C)} -> {y (..., C), aux_loss () f32}: call it with a list, moe(Tensors{x}).
  // Throws InvalidArgument for another shape.
  Tensors forward_multi(const Tensors& inputs) override;

  // Assignments each expert received in the last forward (E counts summing to tokens * k, less
  // those dropped by a capacity); empty before the first. With a dispatcher, summed over the
  // data-parallel ranks (the whole batch's counts, the same on every rank).
  const std::vector<int64_t>& expert_counts() const { return counts_; }
  // Assignments dropped by the capacity in the last forward (0 when dropless).
  int64_t dropped() const { return dropped_; }
  // bias[e] += bias_update_speed * sign(mean load - load[e]) from the last forward's counts,
  // outside autograd. No-op when bias_update_speed is 0 or before the first forward.
  void update_expert_bias();

  // The router's choice for x (N, C) without running the experts: {experts (N, k) i64,
  // weights (N, k) differentiable, scores (N, E)}, as forward uses them.
  Tensors route(const Tensor& x);

  const MoEOptions& options() const { return options_; }

  // Routes the rows through `dispatcher` from the next forward on (null: every expert local).
  // The experts' parameters must then hold this rank's experts only (E / ep on dim 0; expert
  // parallelism reshards them). Throws InvalidArgument, changing nothing, for a capacity factor
  // (expert parallelism is dropless).
  void set_dispatcher(std::shared_ptr<MoEDispatcher> dispatcher);
  MoEDispatcher* dispatcher() const { return dispatcher_.get(); }

 private:
  MoEOptions options_;
  std::shared_ptr<MoEDispatcher> dispatcher_;
  std::vector<int64_t> counts_;
  int64_t dropped_ = 0;
};

}  // namespace tessel::nn
