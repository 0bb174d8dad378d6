#pragma once
// scaled_dot_product_attention: the one attention entry point for Tensors, with autograd.
// Layout (B, H, S, D), any strides; grouped-query attention when H_q is a multiple of H_kv;
// masks (causal in either alignment, sliding window, prefix-LM, documents, a predicate),
// dropout, and a dispatcher over backends (see sdpa_backend.h).
//
//   kernels::SdpaOptions opts;                                  // namespace tessel::kernels
//   opts.causal = true;
//   Tensor out = scaled_dot_product_attention(q, k, v, opts);   // differentiable in q, k, v
//   SdpaOutput r = scaled_dot_product_attention(q, k, v, opts); // r.output, r.logsumexp
//   { SdpaBackendScope only_math(SdpaBackend::kMath); ... }     // force a backend

#include <cstdint>
#include <optional>
#include <vector>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/kernels/attention/sdpa_backend.h"
#include "tessel/tensor/random.h"
#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

struct SdpaOptions {
  bool causal = false;
  // Softmax scale; default 1 / sqrt(D).
  std::optional<double> scale;
  // Where queries sit among keys when S_q != S_k (for causal and the window).
  attention::MaskAlignment alignment = attention::MaskAlignment::kTopLeft;
  // Sliding window in keys before/after the aligned query position; -1 unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Prefix-LM: keys below the length are visible to every query (one value, or one per batch).
  std::vector<int64_t> prefix_lengths;
  // Document masking: integer ids per token, shape (S_q) or (B, S_q); kv ids (S_k) or (B, S_k)
  // default to the query ids when S_q == S_k.
  Tensor document_ids;
  Tensor kv_document_ids;
  // FlexAttention-style predicate (batch, head, q_index, kv_index) -> visible; ANDed with the
  // rest. Must be thread-safe.
  attention::MaskFn mask_fn;
  // Dropout on the probabilities; the mask comes from `generator` (default_generator() when
  // null), which advances by B * H_q * S_q * S_k, and backward regenerates it.
  double dropout_p = 0.0;
  Generator* generator = nullptr;
  // Backward with bitwise-reproducible gradients (see AttentionProblem::deterministic).
  bool deterministic = false;
  // Force a backend (also see SdpaBackendScope). Unset: the fastest that can run the call.
  std::optional<SdpaBackend> backend;
};

// The attention output (like q) and the logsumexp of each query row ((B, H_q, S_q), f32,
// natural log, -inf for rows that see no key). Converts to the output, so
// `Tensor out = scaled_dot_product_attention(...)` works.
struct SdpaOutput {
  Tensor output;
  Tensor logsumexp;
  SdpaBackend backend = SdpaBackend::kMath;   // which backend ran
  operator Tensor() const { return output; }  // NOLINT: implicit on purpose
};

// Computes softmax(scale * q k^T + mask) v (with dropout) and records an autograd node when
// grad mode is on and q, k or v requires a gradient; backward gives dq, dk, dv through the same
// backend (logsumexp is not differentiable: its gradient is ignored). q (B, H_q, S_q, D),
// k and v (B, H_kv, S_k, D), one dtype (f32, bf16, or f16 on CUDA), one device. On the CPU
// the call blocks; on CUDA it is issued to the device's current stream. The output, and
// dq, dk, dv in backward, are laid out in memory like q (and k, v): dims by decreasing stride,
// so heads split out of a (B, S, H·D) projection re-assemble without a copy. A
// lower-precision op under autocast (tensor/autocast.h): q, k, v are cast to its dtype.
// Throws InvalidArgument for bad shapes, dtypes, devices, windows or document ids, and
// Unavailable when no allowed backend can run the call.
SdpaOutput scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const SdpaOptions& options = {});

// A raw view of a 4-D tensor (its data, dtype, device, sizes and strides).
attention::AttentionView attention_view_of(const Tensor& t, const char* name);

}  // namespace tessel::kernels
