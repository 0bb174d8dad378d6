#include "tessel/parallel/cp/gpt_cp.h"

#include <string>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/nn/attention.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel {
namespace {

// nn::CausalSelfAttention's computation with ring attention over the cp group in place of the
// one-process kernel call; the same children.
class CpCausalSelfAttention : public nn::Module {
 public:
  CpCausalSelfAttention(const nn::CausalSelfAttention& original,
                        std::shared_ptr<ProcessGroup> group, const CpLayout& layout,
                        const GptCpOptions& options)
      : Module("CpCausalSelfAttention"),
        n_embd_(original.options().n_embd),
        head_dim_(original.options().n_embd / original.options().n_head),
        group_(std::move(group)),
        layout_(layout),
        options_(options) {
    for (const auto& [name, child] : original.children()) register_module(name, child);
  }

  Tensor forward(const Tensor& x) override {
    TESSEL_CHECK(x.dim() == 3 && x.size(2) == n_embd_, InvalidArgument,
                 "CpCausalSelfAttention expects (B, T, {}), got {}", n_embd_, shape_str(x.shape()));
    const int64_t D = head_dim_;
    const Tensor qkv = child("c_attn")(x);
    const int64_t B = qkv.size(0), T = qkv.size(1), H = qkv.size(2) / (3 * D);
    const std::vector<Tensor> q_k_v = split(qkv, H * D, -1);
    auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, D}), 1, 2); };
    RingAttentionOutput r =
        ring_attention(*group_, heads(q_k_v[0]), heads(q_k_v[1]), heads(q_k_v[2]), layout_,
                       {.causal = true, .algorithm = options_.algorithm});
    Tensor y = reshape(transpose(r.output, 1, 2), {B, T, H * D});
    return child("resid_dropout")(child("c_proj")(y));
  }

 private:
  int64_t n_embd_, head_dim_;
  std::shared_ptr<ProcessGroup> group_;
  CpLayout layout_;
  GptCpOptions options_;
};

}  // namespace

void apply_gpt_context_parallel(nn::GPT& model, std::shared_ptr<ProcessGroup> cp_group,
                                const CpLayout& layout, const GptCpOptions& options) {
  TESSEL_CHECK(cp_group != nullptr && layout.cp() == cp_group->size(), InvalidArgument,
               "apply_gpt_context_parallel: the layout has {} ranks but the cp group has {}",
               layout.cp(), cp_group ? cp_group->size() : 0);
  TESSEL_CHECK(layout.seq_len <= model.config().block_size, InvalidArgument,
               "apply_gpt_context_parallel: sequences of {} tokens exceed block_size {}",
               layout.seq_len, model.config().block_size);
  for (int64_t i = 0; i < model.config().n_layer; ++i) {
    const std::string path = "transformer.h." + std::to_string(i) + ".attn";
    const auto& original = dynamic_cast<const nn::CausalSelfAttention&>(model.submodule(path));
    model.set_submodule(
        path, std::make_shared<CpCausalSelfAttention>(original, cp_group, layout, options));
  }
  const Tensor positions = cp_global_positions(layout, cp_group->rank());
  const int64_t local = positions.size(0);
  model.submodule("transformer.wpe")
      .register_forward_pre_hook([positions, local](nn::Module&, nn::Tensors& inputs) {
        TESSEL_CHECK(inputs[0].numel() == local, InvalidArgument,
                     "context-parallel GPT: called with {} tokens per sequence; this rank holds "
                     "{} of the layout",
                     inputs[0].numel(), local);
        inputs[0] = to(positions, inputs[0].device());
      });
}

CpBatch cp_shard_batch(const Tensor& tokens, const Tensor& targets, const CpLayout& layout,
                       int64_t cp_rank, const Tensor& document_ids) {
  TESSEL_CHECK(tokens.dim() == 2 && targets.shape() == tokens.shape(), InvalidArgument,
               "cp_shard_batch: tokens {} and targets {}; expected both (B, S)",
               shape_str(tokens.shape()), shape_str(targets.shape()));
  const int rank = static_cast<int>(cp_rank);
  CpBatch b;
  b.tokens = cp_shard_sequence(tokens, layout, rank, 1);
  b.targets = cp_shard_sequence(targets, layout, rank, 1);
  b.positions = cp_global_positions(layout, rank);
  if (document_ids.defined()) {
    b.document_ids = cp_shard_sequence(document_ids, layout, rank, document_ids.dim() - 1);
  }
  b.loss_scale = static_cast<double>(layout.local_len(rank) * layout.cp()) /
                 static_cast<double>(layout.seq_len);
  return b;
}

}  // namespace tessel::parallel
