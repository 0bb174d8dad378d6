#include "tessel/nn/transformer.h"

#include "tessel/tensor/ops.h"

namespace tessel::nn {

MLP::MLP(int64_t n_embd, double dropout, bool bias, Generator* gen) : Module("MLP") {
  register_module("c_fc", std::make_shared<Linear>(LinearOptions{n_embd, 4 * n_embd, bias}, gen));
  register_module("c_proj", std::make_shared<Linear>(LinearOptions{4 * n_embd, n_embd, bias}, gen));
  register_module("dropout", std::make_shared<Dropout>(dropout, gen));
}

Tensor MLP::forward(const Tensor& x) {
  return child("dropout")(child("c_proj")(gelu(child("c_fc")(x), GeluApproximation::kTanh)));
}

Block::Block(const AttentionOptions& options, Generator* gen) : Module("Block") {
  register_module("ln_1", std::make_shared<LayerNorm>(options.n_embd, 1e-5, options.bias));
  register_module("attn", std::make_shared<CausalSelfAttention>(options, gen));
  register_module("ln_2", std::make_shared<LayerNorm>(options.n_embd, 1e-5, options.bias));
  register_module("mlp", std::make_shared<MLP>(options.n_embd, options.dropout, options.bias, gen));
}

Tensor Block::forward(const Tensor& x) {
  Tensor h = add(x, child("attn")(child("ln_1")(x)));
  return add(h, child("mlp")(child("ln_2")(h)));
}

}  // namespace tessel::nn
