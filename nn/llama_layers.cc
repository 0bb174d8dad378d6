#include "tessel/nn/llama_layers.h"

#include <memory>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/kernels/llama/rope.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

int64_t head_dim_of(const LlamaAttentionOptions& o) {
  return o.head_dim > 0 ? o.head_dim : (o.n_heads > 0 ? o.dim / o.n_heads : 0);
}

}  // namespace

LlamaAttention::LlamaAttention(const LlamaAttentionOptions& options, Generator* gen)
    : Module("LlamaAttention"), options_(options) {
  TESSEL_CHECK(options.dim > 0 && options.n_heads > 0 && options.n_kv_heads > 0 &&
                   options.n_heads % options.n_kv_heads == 0 && options.head_dim >= 0 &&
                   (options.head_dim > 0 || options.dim % options.n_heads == 0),
               InvalidArgument,
               "LlamaAttention needs positive dim ({}), n_heads ({}) a multiple of n_kv_heads "
               "({}), and dim a multiple of n_heads unless head_dim ({}) is given",
               options.dim, options.n_heads, options.n_kv_heads, options.head_dim);
  options_.head_dim = head_dim_of(options);
  TESSEL_CHECK(options_.head_dim % 2 == 0, InvalidArgument,
               "LlamaAttention needs an even head_dim for rotary positions, got {}",
               options_.head_dim);
  const int64_t C = options.dim, D = options_.head_dim;
  const int64_t H = options.n_heads, Hkv = options.n_kv_heads;
  register_module("q_proj", std::make_shared<Linear>(LinearOptions{C, H * D, false}, gen));
  register_module("k_proj", std::make_shared<Linear>(LinearOptions{C, Hkv * D, false}, gen));
  register_module("v_proj", std::make_shared<Linear>(LinearOptions{C, Hkv * D, false}, gen));
  register_module("o_proj", std::make_shared<Linear>(LinearOptions{H * D, C, false}, gen));
}

Tensors LlamaAttention::forward_multi(const Tensors& inputs) {
  TESSEL_CHECK(inputs.size() == 3 && inputs[0].dim() == 3, InvalidArgument,
               "LlamaAttention takes {{x (B, T, C), cos, sin}}, got {} inputs{}", inputs.size(),
               inputs.empty() ? "" : ", x " + inputs[0].str());
  const Tensor& x = inputs[0];
  const int64_t D = options_.head_dim;
  // (B, T, H D) -> (B, T, H, D), H as the projection gives it (see the header), and T too: under
  // sequence parallelism x is this rank's sequence shard and the projections gather the whole.
  auto heads = [&](const Tensor& t, const char* name) {
    TESSEL_CHECK(t.dim() == 3 && t.size(2) % D == 0, InvalidArgument,
                 "LlamaAttention: {} gave {}, expected (B, T, heads * {})", name,
                 shape_str(t.shape()), D);
    return reshape(t, {t.size(0), t.size(1), t.size(2) / D, D});
  };
  const Tensor q = kernels::rope(heads(child("q_proj")(x), "q_proj"), inputs[1], inputs[2]);
  const Tensor k = kernels::rope(heads(child("k_proj")(x), "k_proj"), inputs[1], inputs[2]);
  const Tensor v = heads(child("v_proj")(x), "v_proj");
  kernels::SdpaOptions sdpa;
  sdpa.causal = true;
  // (B, H, T, D) views; K/V keep their n_kv_heads heads (grouped-query attention in the kernel).
  Tensor y = kernels::scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2),
                                                   transpose(v, 1, 2), sdpa);
  y = reshape(transpose(y, 1, 2), {q.size(0), q.size(1), q.size(2) * D});
  return {child("o_proj")(y)};
}

LlamaMLP::LlamaMLP(int64_t dim, int64_t hidden_dim, Generator* gen) : Module("LlamaMLP") {
  register_module("gate_proj",
                  std::make_shared<Linear>(LinearOptions{dim, hidden_dim, false}, gen));
  register_module("up_proj", std::make_shared<Linear>(LinearOptions{dim, hidden_dim, false}, gen));
  register_module("down_proj",
                  std::make_shared<Linear>(LinearOptions{hidden_dim, dim, false}, gen));
}

Tensor LlamaMLP::forward(const Tensor& x) {
  return child("down_proj")(kernels::swiglu(child("gate_proj")(x), child("up_proj")(x)));
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaAttentionOptions& attention, int64_t hidden_dim,
                                     double norm_eps, Generator* gen, const MoEOptions* moe)
    : Module("LlamaDecoderLayer") {
  register_module("self_attn", std::make_shared<LlamaAttention>(attention, gen));
  if (moe != nullptr) {
    register_module("mlp", std::make_shared<MoE>(*moe, gen));
  } else {
    register_module("mlp", std::make_shared<LlamaMLP>(attention.dim, hidden_dim, gen));
  }
  register_module("input_layernorm", std::make_shared<RMSNorm>(attention.dim, norm_eps));
  register_module("post_attention_layernorm", std::make_shared<RMSNorm>(attention.dim, norm_eps));
}

Tensors LlamaDecoderLayer::forward_multi(const Tensors& inputs) {
  TESSEL_CHECK(inputs.size() == 3, InvalidArgument,
               "LlamaDecoderLayer takes {{x, cos, sin}}, got {} inputs", inputs.size());
  Tensor x = inputs[0];
  x = add(x, child("self_attn")({child("input_layernorm")(x), inputs[1], inputs[2]})[0]);
  if (dynamic_cast<MoE*>(&child("mlp")) != nullptr) {
    const Tensors moe = child("mlp")(Tensors{child("post_attention_layernorm")(x)});
    return {add(x, moe[0]), moe[1]};
  }
  x = add(x, child("mlp")(child("post_attention_layernorm")(x)));
  return {x};
}

}  // namespace tessel::nn
