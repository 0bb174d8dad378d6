#include "tessel/kernels/attention/attention_ops.h"

#include <limits>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels::attention {
namespace {

// `sizes`/`strides` elements of `dtype` at `data` on `device`, as a Tensor over memory owned
// elsewhere.
Tensor tensor_over(void* data, DType dtype, Device device, const Shape& sizes,
                   const Strides& strides) {
  int64_t extent = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) extent = 0;
  }
  if (extent != 0) {
    for (size_t d = 0; d < sizes.size(); ++d) extent += (sizes[d] - 1) * strides[d];
  }
  const Storage storage =
      Storage::wrap(data, static_cast<size_t>(extent) * dtype_size(dtype), device, nullptr);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage;
  impl->shape = sizes;
  impl->strides = strides;
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor tensor_of(const AttentionView& v) {
  return tensor_over(v.data, v.dtype, v.device, Shape(v.sizes, v.sizes + 4),
                     Strides(v.strides, v.strides + 4));
}

// k or v (B, H_kv, S, D) repeated for the query heads of its group: (B, H_q, S, D).
Tensor repeat_heads(const Tensor& t, int64_t groups) {
  if (groups == 1) return t;
  const Shape s = t.shape();
  return reshape(expand(unsqueeze(t, 2), {s[0], s[1], groups, s[2], s[3]}),
                 {s[0], s[1] * groups, s[2], s[3]});
}

// The gradient of repeat_heads: the group's heads summed.
Tensor sum_heads(const Tensor& g, int64_t groups) {
  if (groups == 1) return g;
  const Shape s = g.shape();
  return sum(reshape(g, {s[0], s[1] / groups, groups, s[2], s[3]}), {2});
}

// scale q k^T + mask in f32: (B, H_q, S_q, S_k), -inf where a key is hidden.
Tensor masked_scores(const AttentionProblem& p, const Tensor& q, const Tensor& k) {
  Tensor scores = mul(to(matmul(q, transpose(k, -1, -2)), DType::kF32), p.softmax_scale());
  if (!p.mask.causal) return scores;
  const int64_t sq = p.q_len(), sk = p.kv_len();
  const int64_t shift = p.mask.alignment == MaskAlignment::kBottomRight ? sk - sq : 0;
  const Device device = q.device();
  const Tensor rows = add(unsqueeze(arange(sq, DType::kI64, device), 1), static_cast<double>(shift));
  const Tensor cols = unsqueeze(arange(sk, DType::kI64, device), 0);
  return masked_fill(scores, gt(cols, rows), -std::numeric_limits<double>::infinity());
}

}  // namespace

std::string ops_attention_unsupported(const AttentionProblem& p) {
  const AttentionMask& m = p.mask;
  if (m.window_left >= 0 || m.window_right >= 0) return "sliding windows need a fused kernel";
  if (!m.prefix_lengths.empty()) return "prefix-LM masks need a fused kernel";
  if (m.has_documents()) return "document masks need a fused kernel";
  if (m.mask_fn) return "mask predicates need a fused kernel";
  if (p.dropout.p > 0) return "attention dropout needs a fused kernel";
  if (m.causal && m.alignment == MaskAlignment::kBottomRight && p.q_len() > p.kv_len()) {
    return "a bottom-right causal mask with more queries than keys leaves rows empty";
  }
  return "";
}

void ops_attention_forward(const AttentionProblem& p, const AttentionView& out, float* lse) {
  NoGradGuard no_grad;
  const int64_t groups = p.q_heads() / p.kv_heads();
  const Tensor q = tensor_of(p.q);
  const Tensor k = repeat_heads(tensor_of(p.k), groups);
  const Tensor v = repeat_heads(tensor_of(p.v), groups);
  const Tensor scores = masked_scores(p, q, k);
  const Tensor log_probs = log_softmax(scores, -1);
  copy_(tensor_of(out), matmul(to(exp(log_probs), p.q.dtype), v));
  if (lse != nullptr && scores.numel() > 0) {
    // lse = score - log probability at any visible key; key 0 is visible to every query of the
    // masks supported here.
    const Tensor logsumexp = sub(select(scores, -1, 0), select(log_probs, -1, 0));
    copy_(tensor_over(lse, DType::kF32, p.q.device, {p.batch(), p.q_heads(), p.q_len()},
                      {p.q_heads() * p.q_len(), p.q_len(), 1}),
          logsumexp);
  }
}

void ops_attention_backward(const AttentionProblem& p, const AttentionView& out,
                            const AttentionView& dout, const AttentionView& dq,
                            const AttentionView& dk, const AttentionView& dv) {
  NoGradGuard no_grad;
  const int64_t groups = p.q_heads() / p.kv_heads();
  const DType dtype = p.q.dtype;
  const Tensor q = tensor_of(p.q);
  const Tensor k = repeat_heads(tensor_of(p.k), groups);
  const Tensor v = repeat_heads(tensor_of(p.v), groups);
  const Tensor o = tensor_of(out), g = tensor_of(dout);
  const Tensor probs = softmax(masked_scores(p, q, k), -1);
  // dS = P (dP - rowsum(dO o O)) scale, with dP = dO V^T.
  const Tensor dprobs = to(matmul(g, transpose(v, -1, -2)), DType::kF32);
  const Tensor row = sum(mul(to(g, DType::kF32), to(o, DType::kF32)), {-1}, true);
  const Tensor dscores = to(mul(mul(probs, sub(dprobs, row)), p.softmax_scale()), dtype);
  copy_(tensor_of(dq), matmul(dscores, k));
  copy_(tensor_of(dk), sum_heads(matmul(transpose(dscores, -1, -2), q), groups));
  copy_(tensor_of(dv), sum_heads(matmul(transpose(to(probs, dtype), -1, -2), g), groups));
}

}  // namespace tessel::kernels::attention
