// Autograd engine: backward semantics, accumulation, no-grad, detach, hooks, custom functions,
// determinism.
#include "tessel/tensor/autograd.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel {
namespace {

std::vector<float> values(const Tensor& t) { return to_vector<float>(t); }

// Targets 0..7 repeating, for 8 classes.
Tensor remainder_free(const Tensor& t) {
  std::vector<int64_t> v = to_vector<int64_t>(t);
  for (int64_t& x : v) x %= 8;
  return from_vector<int64_t>(v, t.shape());
}

TEST(AutogradTest, ScalarBackwardAndAccumulation) {
  Tensor x = from_vector<float>({1, 2, 3}).set_requires_grad(true);
  backward(sum(mul(x, x)));  // d/dx = 2x
  EXPECT_EQ(values(x.grad()), std::vector<float>({2, 4, 6}));
  backward(sum(mul(x, 3.0)));  // accumulates + 3
  EXPECT_EQ(values(x.grad()), std::vector<float>({5, 7, 9}));
  x.set_grad(Tensor());
  backward(sum(x));
  EXPECT_EQ(values(x.grad()), std::vector<float>({1, 1, 1}));
}

TEST(AutogradTest, ReusedTensorSumsBothPaths) {
  Tensor x = from_vector<float>({2}).set_requires_grad(true);
  const Tensor y = mul(x, x);
  backward(sum(add(y, mul(y, x))));  // x^2 + x^3 -> 2x + 3x^2 = 16
  EXPECT_EQ(values(x.grad()), std::vector<float>({16}));
}

// A leaf may take over the gradient that reaches it instead of copying it, but only one that
// nothing else holds: the same gradient on its way to two leaves, or a gradient a hook keeps,
// must not end up shared with another tensor.
TEST(AutogradTest, LeafGradientsNeverAliasOtherTensors) {
  const Tensor x = ones({3, 4}).set_requires_grad(true);
  const Tensor y = ones({3, 4}).set_requires_grad(true);
  const Tensor w = ones({5, 4}).set_requires_grad(true);
  Tensor kept;
  register_hook(w, [&](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  backward(sum(linear(add(x, y), w)));  // add passes one gradient tensor to both x and y
  ASSERT_TRUE(x.grad().defined() && y.grad().defined() && w.grad().defined());
  EXPECT_FALSE(x.grad().storage().is_same(y.grad().storage()));
  EXPECT_FALSE(w.grad().storage().is_same(kept.storage()));
  mul_(x.grad(), 2.0);
  mul_(kept, 3.0);
  EXPECT_EQ(to_vector<float>(y.grad()), std::vector<float>(12, 5.0f));
  EXPECT_EQ(to_vector<float>(x.grad()), std::vector<float>(12, 10.0f));
  EXPECT_EQ(to_vector<float>(w.grad()), std::vector<float>(20, 6.0f));
  // A second pass accumulates into the gradients it received the first time.
  backward(sum(linear(add(x, y), w)));
  EXPECT_EQ(to_vector<float>(y.grad()), std::vector<float>(12, 10.0f));
  EXPECT_EQ(to_vector<float>(w.grad()), std::vector<float>(20, 12.0f));
}

TEST(AutogradTest, NonScalarNeedsGradient) {
  Tensor x = ones({2, 3}).set_requires_grad(true);
  const Tensor y = mul(x, 2.0);
  try {
    backward(y);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 3)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(backward(y, ones({3})), InvalidArgument);
  backward(y, full({2, 3}, 0.5));
  EXPECT_EQ(values(x.grad()), std::vector<float>(6, 1.0f));
  EXPECT_THROW(backward(ones({1})), InvalidArgument);  // does not require grad
}

TEST(AutogradTest, NoGradGuardAndDetach) {
  Tensor x = ones({2}).set_requires_grad(true);
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(grad_enabled());
    EXPECT_FALSE(mul(x, 2.0).requires_grad());
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(mul(x, 2.0).requires_grad());
  const Tensor d = detach(mul(x, 2.0));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(is_leaf(d));
  EXPECT_THROW(fill_(x, 0.0), InvalidArgument);  // in-place on a tensor that requires grad
}

TEST(AutogradTest, SecondBackwardNeedsRetainGraph) {
  Tensor x = from_vector<float>({3}).set_requires_grad(true);
  const Tensor y = sum(exp(x));
  backward(y, Tensor(), /*retain_graph=*/true);
  backward(y);
  EXPECT_NEAR(values(x.grad())[0], 2 * std::exp(3.0f), 1e-3);
  EXPECT_THROW(backward(y), InvalidArgument);
}

TEST(AutogradTest, HooksSeeAndReplaceGradients) {
  Tensor x = from_vector<float>({1, 2}).set_requires_grad(true);
  std::vector<float> seen;
  register_hook(x, [&](const Tensor& g) {
    seen = values(g);
    return mul(g, 10.0);
  });
  const Tensor y = mul(x, 3.0);
  register_hook(y, [](const Tensor& g) { return add(g, 1.0); });  // non-leaf hook
  int ready = 0;
  register_post_accumulate_grad_hook(x, [&](const Tensor& leaf) {
    ++ready;
    EXPECT_EQ(values(leaf.grad()), std::vector<float>({60, 60}));
  });
  backward(sum(y));  // dy = 1 (+1 by hook) -> dx = 6 -> x10 by leaf hook
  EXPECT_EQ(seen, std::vector<float>({6, 6}));
  EXPECT_EQ(ready, 1);
  EXPECT_EQ(values(x.grad()), std::vector<float>({60, 60}));
  clear_hooks(x);
  x.set_grad(Tensor());
  backward(sum(mul(x, 3.0)));
  EXPECT_EQ(values(x.grad()), std::vector<float>({3, 3}));
  EXPECT_EQ(ready, 1);
}

TEST(AutogradTest, PostAccumulateHookFiresOncePerLeafAfterAllPaths) {
  // Two parameters used twice each: each hook fires once, after its gradient is complete.
  Tensor a = from_vector<float>({1}).set_requires_grad(true);
  Tensor b = from_vector<float>({2}).set_requires_grad(true);
  std::vector<std::pair<char, float>> order;
  register_post_accumulate_grad_hook(
      a, [&](const Tensor& t) { order.emplace_back('a', values(t.grad())[0]); });
  register_post_accumulate_grad_hook(
      b, [&](const Tensor& t) { order.emplace_back('b', values(t.grad())[0]); });
  const Tensor h = mul(a, 2.0);                  // layer 1
  const Tensor out = add(mul(h, b), mul(a, b));  // layer 2 uses a again
  backward(sum(out));
  ASSERT_EQ(order.size(), 2u);
  // d/da = 2b + b = 6, d/db = 2a + a = 3.
  for (auto [name, value] : order) EXPECT_EQ(value, name == 'a' ? 6.0f : 3.0f);
}

TEST(AutogradTest, CustomFunctionWithTwoOutputsAndContextData) {
  Tensor x = from_vector<float>({1, 2, 3, 4}).set_requires_grad(true);
  auto outs = apply_function(
      "halves", {x},
      [](FunctionContext& ctx, const std::vector<Tensor>& in) {
        ctx.data = int64_t{2};
        return std::vector<Tensor>{contiguous(narrow(in[0], 0, 0, 2)),
                                   contiguous(narrow(in[0], 0, 2, 2))};
      },
      [](FunctionContext& ctx, const std::vector<Tensor>& g) {
        EXPECT_EQ(std::any_cast<int64_t>(ctx.data), 2);
        EXPECT_TRUE(ctx.needs_input_grad(0));
        return std::vector<Tensor>{cat({g[0], g[1]})};
      });
  ASSERT_EQ(outs.size(), 2u);
  backward(sum(mul(outs[1], 5.0)));  // the first output gets no gradient: zeros are supplied
  EXPECT_EQ(values(x.grad()), std::vector<float>({0, 0, 5, 5}));
}

TEST(AutogradTest, BackwardIsBitwiseDeterministic) {
  auto run = [] {
    Generator gen(5);
    Tensor w = randn({16, 32}, gen).set_requires_grad(true);
    Tensor x = randn({64, 32}, gen);
    const Tensor h = gelu(linear(x, w));
    const Tensor loss = add(mean(mul(h, h)), sum(softmax(h)));
    backward(loss);
    return values(w.grad());
  };
  EXPECT_EQ(run(), run());
}

// The same computation at the size above and at one whose activations fill whole blocks of the
// allocator cache (>= 1 MiB), repeated at several thread counts: the linear layers' matmuls split
// into equal row chunks that run at the same time, forward and backward.
TEST(AutogradTest, BackwardIsBitwiseDeterministicAcrossThreadCountsAndSizes) {
  const int before = num_threads();
  struct Size {
    int64_t rows, in, out;
  };
  for (const Size& size : {Size{64, 32, 16}, Size{1024, 256, 256}}) {
    auto run = [&size] {
      Generator gen(5);
      Tensor w = randn({size.out, size.in}, gen).set_requires_grad(true);
      Tensor x = randn({size.rows, size.in}, gen);
      const Tensor h = gelu(linear(x, w));
      const Tensor loss = add(mean(mul(h, h)), sum(softmax(h)));
      backward(loss);
      return values(w.grad());
    };
    for (int threads : {2, 3, 4, 8}) {
      set_num_threads(threads);
      const std::vector<float> first = run();
      for (int rep = 0; rep < 30; ++rep) {
        const std::vector<float> again = run();
        EXPECT_EQ(again, first) << "rows " << size.rows << ", threads " << threads
                                << ", repetition " << rep;
        if (again != first) break;  // one report per thread count
      }
    }
  }
  set_num_threads(before);
}

// Gradients of a small MLP block computed in bf16 stay within 5% of the largest f32 gradient
// component (each bf16 op rounds to 2^-8 relative; a dozen ops in sequence compound that).
TEST(AutogradTest, BF16GradientsTrackF32) {
  auto grads = [](DType dtype) {
    Generator gen(11);
    Tensor w1 = to(mul(randn({32, 16}, gen), 0.2), dtype).set_requires_grad(true);
    Tensor w2 = to(mul(randn({8, 32}, gen), 0.2), dtype).set_requires_grad(true);
    Tensor g = to(ones({16}), dtype).set_requires_grad(true);
    const Tensor x = to(randn({24, 16}, gen), dtype);
    const Tensor target = to(arange(0.0, 24.0, 1.0, DType::kI64), DType::kI64);
    const Tensor h = gelu(linear(layer_norm(x, g, Tensor()), w1), GeluApproximation::kTanh);
    const Tensor logits = linear(h, w2);
    backward(cross_entropy(logits, remainder_free(target)));
    return std::vector<Tensor>{w1.grad(), w2.grad(), g.grad()};
  };
  const auto f32 = grads(DType::kF32), bf16 = grads(DType::kBF16);
  for (size_t k = 0; k < f32.size(); ++k) {
    EXPECT_EQ(bf16[k].dtype(), DType::kBF16);
    const auto a = to_vector<float>(f32[k]), b = to_vector<float>(bf16[k]);
    float scale = 0;
    for (float v : a) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.05 * scale) << k << " " << i;
  }
}

TEST(AutogradTest, BF16LeafGetsBF16Gradient) {
  Tensor w = to(ones({3}), DType::kBF16).set_requires_grad(true);
  backward(sum(mul(to(w, DType::kF32), 2.0)));
  EXPECT_EQ(w.grad().dtype(), DType::kBF16);
  EXPECT_EQ(values(w.grad()), std::vector<float>({2, 2, 2}));
}

}  // namespace
}  // namespace tessel
