#pragma once
// RotaryEmbedding: the cos/sin tables of rotary position embeddings for explicit positions, as
// Hugging Face's LlamaRotaryEmbedding (Llama 3 frequency scaling optional). The rotation itself
// is kernels::rope (fused on the CPU), which the attention layers call.
//
//   RotaryEmbedding rotary(/*head_dim=*/64, /*theta=*/500000.0, kernels::RopeScaling{});
//   Tensors cs = rotary({positions});              // positions (T) or (B, T) -> cos, sin
//   Tensor q_rot = kernels::rope(q, cs[0], cs[1]); // q (B, T, H, 64)

#include <cstdint>
#include <optional>

#include "tessel/kernels/llama/rope.h"
#include "tessel/nn/module.h"

namespace tessel::nn {

// No parameters and no buffers (Hugging Face's inv_freq is not saved either): the inverse
// frequencies are kept on the CPU and the tables are made on the positions' device.
// Thread-safety and ownership: as Module.
class RotaryEmbedding : public Module {
 public:
  // Throws InvalidArgument as kernels::rope_inv_freq.
  RotaryEmbedding(int64_t head_dim, double theta,
                  const std::optional<kernels::RopeScaling>& scaling = std::nullopt);
  // {positions} (integer (T) or (B, T)) -> {cos, sin}, each (..., head_dim / 2) f32. Positions
  // are absolute: a shard of a sequence passes the positions of its own tokens.
  Tensors forward_multi(const Tensors& inputs) override;

  const Tensor& inv_freq() const { return inv_freq_; }

 private:
  Tensor inv_freq_;
};

}  // namespace tessel::nn
