#pragma once
// Causal multi-head self-attention with the GPT-2 layout: one projection to q, k and v
// ("c_attn", (3C, C)), attention through kernels::scaled_dot_product_attention, and an output
// projection ("c_proj", (C, C)).

#include <cstdint>
#include <memory>

#include "tessel/nn/dropout.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/module.h"

namespace tessel::nn {

struct AttentionOptions {
  int64_t n_embd = 0;
  int64_t n_head = 1;
  double dropout = 0.0;  // on the output (residual) path
  bool bias = true;
};

// Thread-safety and ownership: as Module.
class CausalSelfAttention : public Module {
 public:
  // Throws InvalidArgument unless n_embd is a positive multiple of n_head.
  explicit CausalSelfAttention(const AttentionOptions& options, Generator* gen = nullptr);
  // x (B, T, C) -> (B, T, C); position t attends positions 0..t. The heads are counted from
  // c_attn's output, (B, T', 3 * H' * C / n_head): whole, H' = n_head and T' = T; under tensor
  // parallelism (c_attn replaced by a column-parallel layer) this rank's heads, and with
  // sequence parallelism the whole sequence gathered from T-row shards.
  Tensor forward(const Tensor& x) override;

  const AttentionOptions& options() const { return options_; }

 private:
  AttentionOptions options_;
};

}  // namespace tessel::nn
