#include "tessel/nn/attention.h"

#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

CausalSelfAttention::CausalSelfAttention(const AttentionOptions& options, Generator* gen)
    : Module("CausalSelfAttention"), options_(options) {
  TESSEL_CHECK(options.n_embd > 0 && options.n_head > 0 && options.n_embd % options.n_head == 0,
               InvalidArgument,
               "attention needs n_embd ({}) to be a positive multiple of n_head ({})",
               options.n_embd, options.n_head);
  const int64_t C = options.n_embd;
  register_module("c_attn", std::make_shared<Linear>(LinearOptions{C, 3 * C, options.bias}, gen));
  register_module("c_proj", std::make_shared<Linear>(LinearOptions{C, C, options.bias}, gen));
  register_module("resid_dropout", std::make_shared<Dropout>(options.dropout, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  TESSEL_CHECK(x.dim() == 3 && x.size(2) == options_.n_embd, InvalidArgument,
               "CausalSelfAttention expects (B, T, {}), got {}", options_.n_embd,
               shape_str(x.shape()));
  const int64_t D = options_.n_embd / options_.n_head;
  // (B, T, 3 H D) -> q, k, v each (B, H, T, D); H and T as c_attn gives them (see attention.h).
  const Tensor qkv = child("c_attn")(x);
  TESSEL_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * D) == 0, InvalidArgument,
               "CausalSelfAttention: c_attn gave {}, expected (B, T, 3 * heads * {})",
               shape_str(qkv.shape()), D);
  const int64_t B = qkv.size(0), T = qkv.size(1), H = qkv.size(2) / (3 * D);
  const std::vector<Tensor> q_k_v = split(qkv, H * D, -1);
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, D}), 1, 2); };
  kernels::SdpaOptions sdpa;
  sdpa.causal = true;
  Tensor y = kernels::scaled_dot_product_attention(heads(q_k_v[0]), heads(q_k_v[1]),
                                                   heads(q_k_v[2]), sdpa);
  y = reshape(transpose(y, 1, 2), {B, T, H * D});  // re-assemble the heads side by side
  return child("resid_dropout")(child("c_proj")(y));
}

}  // namespace tessel::nn
