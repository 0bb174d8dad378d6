// Deferred weight gradients (zero-bubble's B/W split): under a DeferWeightGradsGuard, backward
// gives input gradients at once and leaves linear's weight and bias gradients in the store;
// run() then gives the gradients a plain backward gives, bit for bit, firing the leaves' hooks.
#include "tessel/tensor/deferred_grad.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

std::vector<float> values(const Tensor& t) { return to_vector<float>(to(t, DType::kF32)); }

// A two-layer MLP with a tied weight used by no other op, and a non-leaf weight (w3 * 2).
struct Mlp {
  Tensor x, w1, b1, w2, b2, w3;
  explicit Mlp(uint64_t seed) {
    Generator gen(seed);
    x = randn({5, 6}, gen).set_requires_grad(true);
    w1 = randn({7, 6}, gen).set_requires_grad(true);
    b1 = randn({7}, gen).set_requires_grad(true);
    w2 = randn({3, 7}, gen).set_requires_grad(true);
    b2 = randn({3}, gen).set_requires_grad(true);
    w3 = randn({3, 3}, gen).set_requires_grad(true);
  }
  Tensor loss() const {
    Tensor h = gelu(linear(x, w1, b1));
    Tensor y = linear(h, w2, b2);
    Tensor z = linear(y, mul(w3, 2.0));  // weight is an op result: not deferrable
    return sum(mul(z, z));
  }
  std::vector<Tensor> weights() const { return {w1, b1, w2, b2}; }
};

TEST(DeferredWeightGradsTest, BackwardGivesInputGradsNowAndWeightGradsAtRun) {
  const Mlp plain(3), split(3);
  backward(plain.loss());

  DeferredWeightGrads store;
  {
    DeferWeightGradsGuard defer(&store);
    EXPECT_EQ(deferred_weight_grads(), &store);
    backward(split.loss());
  }
  EXPECT_EQ(deferred_weight_grads(), nullptr);
  // B: the input's and the non-leaf path's gradients are complete; the linear weights wait.
  EXPECT_EQ(values(split.x.grad()), values(plain.x.grad()));
  EXPECT_EQ(values(split.w3.grad()), values(plain.w3.grad()));
  for (const Tensor& w : split.weights()) EXPECT_FALSE(w.grad().defined());
  // Two linears with leaf weights: two dW GEMMs (and bias sums) moved out of the pass.
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.deferred_total(), 2);

  store.run();
  EXPECT_TRUE(store.empty());
  const std::vector<Tensor> want = plain.weights(), got = split.weights();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(values(got[i].grad()), values(want[i].grad())) << "weight " << i;
  }
}

TEST(DeferredWeightGradsTest, RunAccumulatesAndFiresHooksThenCallbacks) {
  Mlp m(5);
  std::vector<std::string> events;
  register_hook(m.w2, [&](const Tensor& g) {
    events.push_back("hook");
    return mul(g, 2.0);  // replaces the gradient, as in backward()
  });
  register_post_accumulate_grad_hook(m.w2, [&](const Tensor&) {
    events.push_back("post");
    queue_callback([&] { events.push_back("callback"); });
  });
  const Mlp plain(5);
  backward(plain.loss());
  backward(plain.loss());  // twice: the second accumulates

  DeferredWeightGrads store;
  for (int pass = 0; pass < 2; ++pass) {
    {
      DeferWeightGradsGuard defer(&store);
      backward(m.loss());
    }
    EXPECT_TRUE(events.empty()) << "no hook of w2 runs in the deferring pass";
    store.run();
    EXPECT_EQ(events, (std::vector<std::string>{"hook", "post", "callback"}));
    events.clear();
  }
  EXPECT_EQ(values(m.w1.grad()), values(plain.w1.grad()));
  EXPECT_EQ(values(m.w2.grad()), values(mul(plain.w2.grad(), 2.0)));
  EXPECT_FALSE(in_backward());
}

TEST(DeferredWeightGradsTest, AutocastBf16MatchesPlainBackward) {
  const Mlp plain(9), split(9);
  DeferredWeightGrads store;
  {
    AutocastGuard autocast(DType::kBF16);
    backward(plain.loss());
    DeferWeightGradsGuard defer(&store);
    backward(split.loss());
  }
  EXPECT_EQ(store.size(), 2u);
  store.run();  // outside autocast: runs in the dtypes the forward saved
  const std::vector<Tensor> want = plain.weights(), got = split.weights();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].grad().dtype(), DType::kF32);
    EXPECT_EQ(values(got[i].grad()), values(want[i].grad())) << "weight " << i;
  }
}

TEST(DeferredWeightGradsTest, WithoutAStoreEverythingIsImmediateAndClearDropsWork) {
  Mlp m(11);
  backward(m.loss());
  for (const Tensor& w : m.weights()) EXPECT_TRUE(w.grad().defined());

  Mlp n(11);
  DeferredWeightGrads store;
  {
    DeferWeightGradsGuard defer(&store);
    backward(n.loss());
  }
  store.clear();
  store.run();
  for (const Tensor& w : n.weights()) EXPECT_FALSE(w.grad().defined());
  EXPECT_THROW(store.defer({mul(n.w1, 1.0)}, [] { return std::vector<Tensor>{}; }), Internal);
}

}  // namespace
}  // namespace tessel
