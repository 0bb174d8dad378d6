#pragma once
// The layers of a Llama-class decoder, with Hugging Face's LlamaForCausalLM names: attention
// with grouped-query heads and rotary positions (q_proj, k_proj, v_proj, o_proj), the SwiGLU
// MLP (gate_proj, up_proj, down_proj) and the pre-norm decoder layer around them.

#include <cstdint>

#include "tessel/nn/linear.h"
#include "tessel/nn/module.h"
#include "tessel/nn/moe.h"
#include "tessel/nn/norm.h"

namespace tessel::nn {

struct LlamaAttentionOptions {
  int64_t dim = 0;
  int64_t n_heads = 1;
  int64_t n_kv_heads = 1;  // divides n_heads; n_heads / n_kv_heads query heads share a K/V head
  int64_t head_dim = 0;    // 0: dim / n_heads
};

// Causal self-attention with rotary positions and grouped-query attention: K and V have
// n_kv_heads heads and reach kernels::scaled_dot_product_attention as they are (the kernel
// shares each among its group of query heads; nothing is repeated in memory). Submodules
// "q_proj" (H D, C), "k_proj" (Hkv D, C), "v_proj" (Hkv D, C), "o_proj" (C, H D), no biases.
// Thread-safety and ownership: as Module.
class LlamaAttention : public Module {
 public:
  // Throws InvalidArgument for non-positive sizes, n_heads not a multiple of n_kv_heads, or
  // (without head_dim) dim not a multiple of n_heads.
  explicit LlamaAttention(const LlamaAttentionOptions& options, Generator* gen = nullptr);
  // {x (B, T, C), cos, sin ((T, D/2) or (B, T, D/2), from RotaryEmbedding)} -> {(B, T, C)};
  // position t attends positions 0..t of x. Heads are counted from the projections' outputs,
  // so a tensor-parallel replacement of the projections runs this rank's heads.
  Tensors forward_multi(const Tensors& inputs) override;

  const LlamaAttentionOptions& options() const { return options_; }

 private:
  LlamaAttentionOptions options_;
};

// down_proj(silu(gate_proj(x)) * up_proj(x)) with the pointwise middle fused
// (kernels::swiglu). Submodules "gate_proj" (F, C), "up_proj" (F, C), "down_proj" (C, F), no
// biases. Thread-safety and ownership: as Module.
class LlamaMLP : public Module {
 public:
  // Throws InvalidArgument for sizes below 1.
  LlamaMLP(int64_t dim, int64_t hidden_dim, Generator* gen = nullptr);
  // (..., C) -> (..., C).
  Tensor forward(const Tensor& x) override;
};

// x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x)). Submodules
// "self_attn", "mlp" (a LlamaMLP, or an MoE when `moe` is given), "input_layernorm",
// "post_attention_layernorm" (RMSNorm), in Hugging Face's order. Thread-safety and ownership: as
// Module.
class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaAttentionOptions& attention, int64_t hidden_dim, double norm_eps,
                    Generator* gen = nullptr, const MoEOptions* moe = nullptr);
  // {x (B, T, C), cos, sin} -> {(B, T, C)}, and with an MoE {(B, T, C), aux_loss ()}.
  Tensors forward_multi(const Tensors& inputs) override;
};

}  // namespace tessel::nn
