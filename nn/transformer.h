#pragma once
// The GPT-2 transformer pieces: the MLP (C -> 4C -> GELU(tanh) -> C) and the pre-norm Block
// (x + attn(ln_1(x)), then x + mlp(ln_2(x))).

#include <cstdint>
#include <memory>

#include "tessel/nn/attention.h"
#include "tessel/nn/dropout.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/module.h"
#include "tessel/nn/norm.h"

namespace tessel::nn {

// Submodules "c_fc" (4C, C), "c_proj" (C, 4C), "dropout". Thread-safety: as Module.
class MLP : public Module {
 public:
  MLP(int64_t n_embd, double dropout, bool bias, Generator* gen = nullptr);
  // (..., C) -> (..., C).
  Tensor forward(const Tensor& x) override;
};

// Submodules "ln_1", "attn", "ln_2", "mlp". Thread-safety: as Module.
class Block : public Module {
 public:
  explicit Block(const AttentionOptions& options, Generator* gen = nullptr);
  // (B, T, C) -> (B, T, C).
  Tensor forward(const Tensor& x) override;
};

}  // namespace tessel::nn
