#include "tessel/kernels/attention/sdpa.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "tessel/base/error.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels {
namespace {

using attention::AttentionProblem;

std::vector<int64_t> document_id_values(const Tensor& ids, const char* name) {
  if (!ids.defined()) return {};
  TESSEL_CHECK(ids.dtype() == DType::kI64 || ids.dtype() == DType::kI32, InvalidArgument,
               "scaled_dot_product_attention: {} has dtype {}; expected i64 or i32", name,
               dtype_name(ids.dtype()));
  TESSEL_CHECK(ids.dim() == 1 || ids.dim() == 2, InvalidArgument,
               "scaled_dot_product_attention: {} has shape {}; expected (S) or (B, S)", name,
               shape_str(ids.shape()));
  return to_vector<int64_t>(to(to(ids, Device::cpu()), DType::kI64));
}

// An uninitialised tensor of t's shape whose memory follows t's dims in order of decreasing
// stride: for q viewed (B, H, S, D) out of a (B, S, 3, H, D) projection, the output is laid
// out (B, S, H, D), so re-assembling the heads as (B, S, H·D) is a view, not a copy (and the
// gradients of q, k and v reach the projection's gradient the same way).
Tensor empty_in_layout_of(const Tensor& t) {
  std::vector<int64_t> order(static_cast<size_t>(t.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  Shape memory_shape;
  for (int64_t d : order) memory_shape.push_back(t.size(d));
  const Tensor memory = empty(memory_shape, t.dtype(), t.device());
  Strides strides(order.size());
  for (size_t k = 0; k < order.size(); ++k) strides[order[k]] = memory.stride(k);
  return memory.as_strided(t.shape(), strides, 0);
}

// What forward hands to backward: the problem (views are re-pointed at the saved tensors).
struct SdpaState {
  AttentionProblem problem;
  const SdpaKernel* kernel = nullptr;
};

}  // namespace

attention::AttentionView attention_view_of(const Tensor& t, const char* name) {
  TESSEL_CHECK(t.defined(), InvalidArgument, "scaled_dot_product_attention: {} is undefined", name);
  TESSEL_CHECK(t.dim() == 4, InvalidArgument,
               "scaled_dot_product_attention: {} has shape {}; expected 4 dims (B, H, S, D)", name,
               shape_str(t.shape()));
  attention::AttentionView v;
  v.data = t.data_ptr();
  v.dtype = t.dtype();
  v.device = t.device();
  for (int d = 0; d < 4; ++d) {
    v.sizes[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

SdpaOutput scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                        const SdpaOptions& options) {
  // A lower-precision op under autocast (tensor/autocast.h).
  const Tensor q = autocast_cast(q_in, AutocastCategory::kLowerPrecision);
  const Tensor k = autocast_cast(k_in, AutocastCategory::kLowerPrecision);
  const Tensor v = autocast_cast(v_in, AutocastCategory::kLowerPrecision);
  auto state = std::make_shared<SdpaState>();
  AttentionProblem& p = state->problem;
  p.q = attention_view_of(q, "q");
  p.k = attention_view_of(k, "k");
  p.v = attention_view_of(v, "v");
  p.scale = options.scale;
  p.mask.causal = options.causal;
  p.mask.alignment = options.alignment;
  p.mask.window_left = options.window_left;
  p.mask.window_right = options.window_right;
  p.mask.prefix_lengths = options.prefix_lengths;
  p.mask.q_document_ids = document_id_values(options.document_ids, "document_ids");
  p.mask.kv_document_ids = document_id_values(options.kv_document_ids, "kv_document_ids");
  TESSEL_CHECK(p.mask.kv_document_ids.empty() || !p.mask.q_document_ids.empty(), InvalidArgument,
               "scaled_dot_product_attention: kv_document_ids given without document_ids");
  p.mask.mask_fn = options.mask_fn;
  p.deterministic = options.deterministic;
  attention::validate_attention_problem(p);
  if (options.dropout_p > 0) {
    Generator& gen = options.generator ? *options.generator : default_generator();
    p.dropout = {
        options.dropout_p, gen.seed(),
        gen.reserve(static_cast<uint64_t>(p.batch() * p.q_heads() * p.q_len() * p.kv_len()))};
  }
  const SdpaBackend* forced = options.backend ? &*options.backend : nullptr;
  state->kernel = &select_sdpa_backend(p, forced);

  auto forward = [state](FunctionContext& ctx, const std::vector<Tensor>& in) {
    AttentionProblem& prob = state->problem;
    Tensor out, lse;
    // Selective recomputation keeps the output and the log-sum-exp of the first forward.
    OpOutputCache* cache = op_output_cache();
    if (cache != nullptr && cache->mode() == OpOutputCache::Mode::kReplay) {
      std::vector<Tensor> kept = cache->take("scaled_dot_product_attention");
      out = kept[0];
      lse = kept[1];
    } else {
      OpOutputCacheGuard no_cache(nullptr);
      out = empty_in_layout_of(in[0]);
      lse = empty({prob.batch(), prob.q_heads(), prob.q_len()}, DType::kF32, in[0].device());
      state->kernel->forward(prob, attention_view_of(out, "out"), lse.data<float>());
    }
    if (cache != nullptr && cache->mode() == OpOutputCache::Mode::kStore) {
      cache->store("scaled_dot_product_attention", {out, lse});
    }
    ctx.save_for_backward({in[0], in[1], in[2], out, lse});
    return std::vector<Tensor>{out, lse};
  };
  auto backward = [state](FunctionContext& ctx, const std::vector<Tensor>& grads) {
    const std::vector<Tensor>& saved = ctx.saved_tensors();
    AttentionProblem prob = state->problem;
    prob.q = attention_view_of(saved[0], "q");
    prob.k = attention_view_of(saved[1], "k");
    prob.v = attention_view_of(saved[2], "v");
    Tensor dq = empty_in_layout_of(saved[0]);
    Tensor dk = empty_in_layout_of(saved[1]);
    Tensor dv = empty_in_layout_of(saved[2]);
    // The output gradient may come in another dtype (e.g. f32 into a bf16 graph), and in any
    // layout (a broadcast from sum(), say); the CUDA kernels read it with the output's strides.
    Tensor dout = grads[0].dtype() == saved[3].dtype() ? grads[0] : to(grads[0], saved[3].dtype());
    if (dout.device().is_cuda() && dout.strides() != saved[3].strides()) {
      Tensor like_out = empty_in_layout_of(saved[3]);
      copy_(like_out, dout);
      dout = like_out;
    }
    state->kernel->backward(prob, attention_view_of(saved[3], "out"),
                            attention_view_of(dout, "grad of out"), saved[4].data<float>(),
                            attention_view_of(dq, "dq"), attention_view_of(dk, "dk"),
                            attention_view_of(dv, "dv"));
    return std::vector<Tensor>{dq, dk, dv};
  };
  std::vector<Tensor> outs =
      apply_function("scaled_dot_product_attention", {q, k, v}, forward, backward);
  return SdpaOutput{outs[0], outs[1], state->kernel->backend()};
}

}  // namespace tessel::kernels
