#pragma once
// Rotary position embeddings (RoPE) in Hugging Face's "rotate_half" layout, the one
// LlamaForCausalLM uses: the first and second halves of each head form the (real, imaginary)
// pairs. Frequencies with Llama 3's scaling, cos/sin tables for explicit positions (so a shard of
// a sequence rotates at its offset), and the rotation itself, fused on the CPU.
//
//   Tensor inv_freq = kernels::rope_inv_freq(64, 500000.0, RopeScaling{});   // (32) f32, CPU
//   RopeTables t = kernels::rope_tables(positions, inv_freq);                // (T, 32) each
//   Tensor q_rot = kernels::rope(q, t.cos, t.sin);                           // q (B, T, H, 64)

#include <cstdint>
#include <optional>

#include "tessel/tensor/tensor.h"

namespace tessel::kernels {

// Llama 3's frequency scaling (Hugging Face `rope_type: "llama3"`): wavelengths longer than
// original_max_position_embeddings / low_freq_factor are stretched by `factor`, those shorter
// than original_max_position_embeddings / high_freq_factor are kept, and the band between is
// interpolated smoothly.
struct RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The inverse frequencies theta^(-2i/head_dim), i < head_dim / 2, scaled when `scaling` is set;
// (head_dim / 2) f32 on the CPU, computed in double and rounded once. Throws InvalidArgument for
// an odd or non-positive head_dim, theta <= 0, or a scaling with factor <= 0 or
// high_freq_factor <= low_freq_factor.
Tensor rope_inv_freq(int64_t head_dim, double theta,
                     const std::optional<RopeScaling>& scaling = std::nullopt);

// cos and sin of position * inv_freq, each (..., D/2) f32 for positions (...) on the
// positions' device; as Hugging Face computes them, the angle is the f32 product of the f32
// position and the f32 frequency, and its cos/sin are then rounded to f32.
struct RopeTables {
  Tensor cos;
  Tensor sin;
};
// positions: integer (T) or (B, T). Throws InvalidArgument for other shapes or dtypes.
RopeTables rope_tables(const Tensor& positions, const Tensor& inv_freq);

// Rotates x (B, T, H, D) (f32, bf16 or f16, any strides) by the tables cos, sin (T, D/2) or
// (B, T, D/2) (f32): out[..., i] = x[i] cos_i - x[i + D/2] sin_i, out[..., i + D/2] =
// x[i + D/2] cos_i + x[i] sin_i, computed in f32 and rounded once to x's dtype. Differentiable
// in x (the tables take no gradient). On the CPU and on CUDA one fused pass (backward: the
// inverse rotation, also fused; CUDA: llama/cuda/rope_cuda.cu, on the device's current stream);
// elsewhere the op-by-op rope_reference. Blocks on the CPU. Throws InvalidArgument for
// mismatched shapes.
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin);

// The same rotation as a chain of tensor ops, Hugging Face's apply_rotary_pos_emb written out
// (x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), tables cast to x's dtype first): the
// reference the fused kernel is tested against, and the path on devices without a fused kernel.
Tensor rope_reference(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace tessel::kernels
