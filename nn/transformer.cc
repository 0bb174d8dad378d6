#include "tessel/nn/transformer.h"

#include "tessel/tensor/ops.h"

namespace tessel::nn {

MLP::MLP(int64_t n_embd, double dropout, bool bias, Generator* gen) : Module("MLP") {
  c_fc_ = register_module("c_fc",
                          std::make_shared<Linear>(LinearOptions{n_embd, 4 * n_embd, bias}, gen));
  c_proj_ = register_module(
      "c_proj", std::make_shared<Linear>(LinearOptions{4 * n_embd, n_embd, bias}, gen));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout, gen));
}

Tensor MLP::forward(const Tensor& x) {
  return (*dropout_)((*c_proj_)(gelu((*c_fc_)(x), GeluApproximation::kTanh)));
}

Block::Block(const AttentionOptions& options, Generator* gen) : Module("Block") {
  ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(options.n_embd, 1e-5, options.bias));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(options, gen));
  ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(options.n_embd, 1e-5, options.bias));
  mlp_ = register_module(
      "mlp", std::make_shared<MLP>(options.n_embd, options.dropout, options.bias, gen));
}

Tensor Block::forward(const Tensor& x) {
  Tensor h = add(x, (*attn_)((*ln_1_)(x)));
  return add(h, (*mlp_)((*ln_2_)(h)));
}

}  // namespace tessel::nn
