#pragma once
// The one scaled-dot-product-attention entry point every attention layer calls:
//
//   Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true});   // (B, H, S, D)
//
// Today it is plain math composed of tensor ops (softmax(q k^T * scale + mask) v), so autograd
// flows through it and it runs wherever the ops run; the attention issue swaps in fused
// FlashAttention kernels behind the same signature.

#include <optional>

#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

struct SdpaOptions {
  // Query i attends keys 0..i only (the mask is aligned top-left, as PyTorch's is_causal).
  bool causal = false;
  // Multiplies q k^T; default 1 / sqrt(D).
  std::optional<double> scale = std::nullopt;
};

// q (B, H, Sq, D), k (B, H, Sk, D), v (B, H, Sk, Dv), one floating dtype and device; returns
// (B, H, Sq, Dv). Differentiable in q, k and v. Throws InvalidArgument naming the shapes when
// they do not fit together, or when causal with Sq > Sk would leave a query with no key.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SdpaOptions& options = {});

}  // namespace tessel::kernels
