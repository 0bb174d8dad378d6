#include "tessel/parallel/cp/llama_cp.h"

#include <string>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/rope.h"
#include "tessel/nn/llama_layers.h"
#include "tessel/tensor/ops.h"

namespace tessel::parallel {
namespace {

// nn::LlamaAttention's computation with ring attention over the cp group in place of the
// one-process kernel call; the same children.
class CpLlamaAttention : public nn::Module {
 public:
  CpLlamaAttention(const nn::LlamaAttention& original, std::shared_ptr<ProcessGroup> group,
                   const CpLayout& layout, const GptCpOptions& options)
      : Module("CpLlamaAttention"),
        head_dim_(original.options().head_dim),
        group_(std::move(group)),
        layout_(layout),
        options_(options) {
    for (const auto& [name, child] : original.children()) register_module(name, child);
  }

  nn::Tensors forward_multi(const nn::Tensors& inputs) override {
    TESSEL_CHECK(inputs.size() == 3 && inputs[0].dim() == 3, InvalidArgument,
                 "CpLlamaAttention takes {{x (B, T, C), cos, sin}}, got {} inputs", inputs.size());
    const Tensor& x = inputs[0];
    const int64_t D = head_dim_;
    auto heads = [&](const Tensor& t) {
      return reshape(t, {t.size(0), t.size(1), t.size(2) / D, D});
    };
    const Tensor q = kernels::rope(heads(child("q_proj")(x)), inputs[1], inputs[2]);
    const Tensor k = kernels::rope(heads(child("k_proj")(x)), inputs[1], inputs[2]);
    const Tensor v = heads(child("v_proj")(x));
    const RingAttentionOutput r =
        ring_attention(*group_, transpose(q, 1, 2), transpose(k, 1, 2), transpose(v, 1, 2), layout_,
                       {.causal = true, .algorithm = options_.algorithm});
    const Tensor y = reshape(transpose(r.output, 1, 2), {q.size(0), q.size(1), q.size(2) * D});
    return {child("o_proj")(y)};
  }

 private:
  int64_t head_dim_;
  std::shared_ptr<ProcessGroup> group_;
  CpLayout layout_;
  GptCpOptions options_;
};

}  // namespace

void apply_llama_context_parallel(nn::Llama& model, std::shared_ptr<ProcessGroup> cp_group,
                                  const CpLayout& layout, const GptCpOptions& options) {
  TESSEL_CHECK(cp_group != nullptr && layout.cp() == cp_group->size(), InvalidArgument,
               "apply_llama_context_parallel: the layout has {} ranks but the cp group has {}",
               layout.cp(), cp_group ? cp_group->size() : 0);
  TESSEL_CHECK(layout.seq_len <= model.config().max_seq_len, InvalidArgument,
               "apply_llama_context_parallel: sequences of {} tokens exceed max_seq_len {}",
               layout.seq_len, model.config().max_seq_len);
  for (int64_t i = 0; i < model.config().n_layers; ++i) {
    const std::string path = "model.layers." + std::to_string(i) + ".self_attn";
    const auto& original = dynamic_cast<const nn::LlamaAttention&>(model.submodule(path));
    model.set_submodule(path,
                        std::make_shared<CpLlamaAttention>(original, cp_group, layout, options));
  }
  // Called with tokens alone, the model gets this rank's global positions for its rotary
  // embedding (not 0..S_local-1).
  const Tensor positions = cp_global_positions(layout, cp_group->rank());
  model.register_forward_pre_hook([positions](nn::Module&, nn::Tensors& inputs) {
    if (inputs.size() != 1) return;
    TESSEL_CHECK(inputs[0].dim() == 2 && inputs[0].size(1) == positions.size(0), InvalidArgument,
                 "context-parallel Llama: called with tokens {}; this rank holds {} tokens of "
                 "every sequence",
                 shape_str(inputs[0].shape()), positions.size(0));
    inputs.push_back(to(positions, inputs[0].device()));
  });
}

}  // namespace tessel::parallel
