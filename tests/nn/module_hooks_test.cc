// What parallel wrappers build on in nn::Module: several inputs and outputs, replacing a
// submodule through the registry, backward pre-hooks and hooks, the end-of-backward callback
// queue, moving and re-materialising parameters in place.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/module.h"
#include "tessel/nn/transformer.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

// (x, y) -> (x * w, x + y): two inputs, two outputs.
class Pair : public Module {
 public:
  Pair() : Module("Pair") { w_ = &register_parameter("w", full({3}, 2.0)); }
  Tensors forward_multi(const Tensors& in) override { return {mul(in[0], *w_), add(in[0], in[1])}; }

 private:
  Tensor* w_;
};

// Calls its child "inner" twice, through the registry.
class Twice : public Module {
 public:
  Twice() : Module("Twice") {
    register_module("inner", std::make_shared<Linear>(LinearOptions{3, 3}));
  }
  Tensor forward(const Tensor& x) override { return child("inner")(child("inner")(x)); }
};

// y = x * k (a parameter-free replacement layer).
class Times : public Module {
 public:
  explicit Times(double k) : Module("Times"), k_(k) {}
  Tensor forward(const Tensor& x) override { return mul(x, k_); }

 private:
  double k_;
};

TEST(ModuleCallTest, SeveralInputsAndOutputsAndHooksSeeThemAll) {
  Pair m;
  size_t seen_inputs = 0, seen_outputs = 0;
  m.register_forward_pre_hook([&](Module&, Tensors& in) {
    seen_inputs = in.size();
    if (in.size() == 2) in[1] = full({3}, 10.0);  // replace the second input
  });
  m.register_forward_hook([&](Module&, const Tensors& in, Tensors& out) {
    if (in.size() == 2) {
      EXPECT_EQ(to_vector<float>(in[1]), (std::vector<float>{10, 10, 10}));
    }
    seen_outputs = out.size();
  });
  const Tensors out = m({full({3}, 1.0), full({3}, 5.0)});
  EXPECT_EQ(seen_inputs, 2u);
  EXPECT_EQ(seen_outputs, 2u);
  EXPECT_EQ(to_vector<float>(out[0]), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(to_vector<float>(out[1]), (std::vector<float>{11, 11, 11}));
  // The single-tensor call refuses a module with two outputs, and the default forward_multi
  // refuses two inputs.
  EXPECT_THROW(m(full({3}, 1.0)), InvalidArgument);
  Times t(2);
  EXPECT_THROW(t({full({3}, 1.0), full({3}, 1.0)}), InvalidArgument);
}

TEST(ModuleRegistryTest, AReplacedSubmoduleIsWhatForwardCalls) {
  Twice m;
  const Tensor x = full({1, 3}, 1.0);
  m.set_submodule("inner", std::make_shared<Times>(3.0));
  EXPECT_EQ(to_vector<float>(m(x)), (std::vector<float>{9, 9, 9}));
  EXPECT_EQ(m.named_parameters().size(), 0u);  // the Linear's parameters went with it
  EXPECT_THROW(m.set_submodule("missing", std::make_shared<Times>(1.0)), OutOfRange);
  EXPECT_THROW(m.set_submodule("inner", nullptr), InvalidArgument);
  EXPECT_THROW(m.child_as<Linear>("inner"), InvalidArgument);
  EXPECT_NO_THROW(m.child_as<Times>("inner"));

  // Deep replacement in a transformer block: its MLP's output projection now gives zeros, so
  // the block adds only attention.
  Block block({.n_embd = 8, .n_head = 2, .dropout = 0.0, .bias = true});
  const Tensor h = randn({1, 4, 8});
  const Tensor before = block(h);
  auto zero_projection = std::make_shared<Linear>(LinearOptions{32, 8, /*bias=*/false});
  {
    NoGradGuard no_grad;
    zero_(zero_projection->parameter("weight"));
  }
  block.set_submodule("mlp.c_proj", zero_projection);
  const Tensor after = block(h);
  const Tensor attn_only = add(h, block.child("attn")(block.child("ln_1")(h)));
  EXPECT_EQ(to_vector<float>(after), to_vector<float>(attn_only));
  EXPECT_NE(to_vector<float>(after), to_vector<float>(before));
}

TEST(ModuleBackwardHooksTest, PreHookSeesOutputGradsAndHookSeesInputGrads) {
  Linear layer({.in_features = 3, .out_features = 2, .bias = true});
  std::vector<std::string> order;
  Tensor grad_out, grad_in;
  layer.register_backward_pre_hook([&](Module& m, Tensors& g) {
    order.push_back("pre " + m.type_name());
    ASSERT_EQ(g.size(), 1u);
    grad_out = clone(g[0]);
    g[0] = mul(g[0], 2.0);  // replaced: the layer's own backward sees twice the gradient
  });
  layer.register_backward_hook([&](Module&, Tensors& gi, const Tensors& go) {
    order.push_back("post");
    ASSERT_EQ(gi.size(), 1u);
    EXPECT_EQ(to_vector<float>(go[0]), to_vector<float>(mul(grad_out, 2.0)));
    grad_in = clone(gi[0]);
  });
  const Tensor x = randn({4, 3}).set_requires_grad(true);
  const Tensor y = layer(x);
  order.push_back("forward done");
  backward(sum(mul(y, y)));
  EXPECT_EQ(order, (std::vector<std::string>{"forward done", "pre Linear", "post"}));
  // d sum(y^2) / dy = 2y; the pre-hook doubled it to 4y.
  EXPECT_EQ(to_vector<float>(grad_out), to_vector<float>(mul(y, 2.0)));
  const Tensor expected_dx = matmul(mul(y, 4.0), layer.weight());
  EXPECT_EQ(to_vector<float>(grad_in), to_vector<float>(expected_dx));
  EXPECT_EQ(to_vector<float>(x.grad()), to_vector<float>(expected_dx));
}

TEST(ModuleBackwardHooksTest, HookRunsWithoutInputGradsWhenNoInputNeedsOne) {
  Linear layer({.in_features = 3, .out_features = 2, .bias = false});
  int pre = 0;
  size_t post_inputs = 99;
  layer.register_backward_pre_hook([&](Module&, Tensors&) { ++pre; });
  layer.register_backward_hook(
      [&](Module&, Tensors& gi, const Tensors&) { post_inputs = gi.size(); });
  backward(sum(layer(randn({2, 3}))));  // the input needs no gradient; the weight does
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post_inputs, 0u);
  ASSERT_TRUE(layer.weight().grad().defined());
  // No hooks run under NoGradGuard or after removal.
  pre = 0;
  {
    NoGradGuard no_grad;
    layer(randn({2, 3}));
  }
  EXPECT_EQ(pre, 0);
}

TEST(BackwardCallbackTest, QueuedCallbacksRunOnceAfterTheWholeGraphInOrder) {
  Linear a({.in_features = 3, .out_features = 3});
  Linear b({.in_features = 3, .out_features = 3});
  std::vector<std::string> order;
  a.register_backward_pre_hook([&](Module&, Tensors&) {
    order.push_back("a");
    queue_callback([&] {
      order.push_back("callback 1");
      queue_callback([&] { order.push_back("callback 3 (queued by 1)"); });
    });
  });
  b.register_backward_pre_hook([&](Module&, Tensors&) {
    order.push_back("b");
    queue_callback([&] { order.push_back("callback 2"); });
  });
  EXPECT_FALSE(in_backward());
  backward(sum(b(a(randn({2, 3}).set_requires_grad(true)))));
  EXPECT_EQ(order, (std::vector<std::string>{"b", "a", "callback 2", "callback 1",
                                             "callback 3 (queued by 1)"}));
  EXPECT_THROW(queue_callback([] {}), InvalidArgument);
}

TEST(ModuleMoveTest, ToAndToEmptyChangeDataInPlaceKeepingReferences) {
  Linear layer({.in_features = 4, .out_features = 2});
  const Tensor weight_handle = layer.weight();
  layer.to(DType::kBF16);
  EXPECT_EQ(weight_handle.dtype(), DType::kBF16);  // the same tensor, converted
  EXPECT_TRUE(weight_handle.requires_grad());
  layer.to(DType::kF32);
  layer.to(Device::meta());
  EXPECT_TRUE(weight_handle.is_meta());
  layer.to_empty(Device::cpu());
  EXPECT_EQ(weight_handle.device(), Device::cpu());
  EXPECT_EQ(weight_handle.shape(), (Shape{2, 4}));
  EXPECT_NO_THROW(weight_handle.data<float>());
}

}  // namespace
}  // namespace tessel::nn
