#pragma once
// Mixture of experts: the feed-forward layer of a DeepSeek/Qwen-MoE-style decoder. A router
// picks k of E SwiGLU experts per token, the experts run as grouped matmuls over the tokens
// sorted by expert, and their outputs are combined weighted by the router's scores.
//
//   MoE moe({.dim = 64, .hidden_dim = 32, .num_experts = 8, .top_k = 2});
//   Tensors out = moe(Tensors{x});                    // {y (..., C), aux_loss ()}
//   moe.expert_counts();                         // tokens per expert of that forward
//   moe.update_expert_bias();                    // aux-loss-free balancing, after the step

#include <cstdint>
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

// The routed layer. Submodules and parameters, in DeepSeek's names: "gate" (Linear (E, C), no
// bias), "experts.gate_proj" (E, C, F), "experts.up_proj" (E, C, F), "experts.down_proj"
// (E, F, C) stacked so each is one [E, K, N] operand of kernels::grouped_matmul, and with
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
  // those dropped by a capacity); empty before the first.
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

 private:
  MoEOptions options_;
  std::vector<int64_t> counts_;
  int64_t dropped_ = 0;
};

}  // namespace tessel::nn
