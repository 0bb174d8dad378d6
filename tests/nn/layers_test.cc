// The single layers against loops written here, and their error paths.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/dropout.h"
#include "tessel/nn/embedding.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/norm.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

TEST(LinearTest, MatchesLoopWithAndWithoutBias) {
  Generator gen(4);
  for (bool bias : {true, false}) {
    Linear layer({.in_features = 5, .out_features = 3, .bias = bias}, &gen);
    EXPECT_EQ(layer.named_parameters().size(), bias ? 2u : 1u);
    const Tensor x = randn({2, 4, 5}, gen);  // extra leading dims pass through
    const Tensor y = layer(x);
    ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
    const auto xv = to_vector<float>(x), wv = to_vector<float>(layer.weight()),
               yv = to_vector<float>(y);
    const std::vector<float> bv = bias ? to_vector<float>(layer.bias()) : std::vector<float>(3);
    for (int n = 0; n < 8; ++n) {
      for (int o = 0; o < 3; ++o) {
        double acc = bv[o];
        for (int i = 0; i < 5; ++i) acc += double(xv[n * 5 + i]) * wv[o * 5 + i];
        EXPECT_NEAR(yv[n * 3 + o], acc, 1e-5);
      }
    }
    // PyTorch's initialisation range.
    for (float w : wv) EXPECT_LE(std::abs(w), 1.0 / std::sqrt(5.0));
  }
  EXPECT_THROW(Linear({.in_features = 0, .out_features = 3}), InvalidArgument);
}

TEST(EmbeddingTest, LooksUpRowsAndRejectsOutOfRange) {
  Embedding table(6, 3);
  const Tensor out = table(from_vector<int64_t>({5, 0, 5}, {3}));
  const auto w = to_vector<float>(table.weight()), o = to_vector<float>(out);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(o[0 * 3 + c], w[5 * 3 + c]);
    EXPECT_EQ(o[1 * 3 + c], w[0 * 3 + c]);
  }
  EXPECT_THROW(table(from_vector<int64_t>({6}, {1})), OutOfRange);
  EXPECT_THROW(table(from_vector<int64_t>({-1}, {1})), OutOfRange);
}

TEST(NormTest, RMSNormAndLayerNormMatchLoops) {
  Generator gen(9);
  const int R = 4, C = 7;
  const Tensor x = randn({R, C}, gen);
  RMSNorm rms(C, 1e-6);
  LayerNorm ln(C, 1e-5);
  {
    NoGradGuard no_grad;
    copy_(rms.parameter("weight"), randn({C}, gen));
    copy_(ln.parameter("weight"), randn({C}, gen));
    copy_(ln.parameter("bias"), randn({C}, gen));
  }
  const auto xv = to_vector<float>(x), rv = to_vector<float>(rms(x)), lv = to_vector<float>(ln(x));
  const auto rw = to_vector<float>(rms.parameter("weight"));
  const auto lw = to_vector<float>(ln.parameter("weight")),
             lb = to_vector<float>(ln.parameter("bias"));
  for (int r = 0; r < R; ++r) {
    double ms = 0, mean = 0, var = 0;
    for (int c = 0; c < C; ++c) ms += double(xv[r * C + c]) * xv[r * C + c] / C;
    for (int c = 0; c < C; ++c) mean += xv[r * C + c] / double(C);
    for (int c = 0; c < C; ++c) var += (xv[r * C + c] - mean) * (xv[r * C + c] - mean) / C;
    for (int c = 0; c < C; ++c) {
      EXPECT_NEAR(rv[r * C + c], xv[r * C + c] / std::sqrt(ms + 1e-6) * rw[c], 1e-5);
      EXPECT_NEAR(lv[r * C + c], (xv[r * C + c] - mean) / std::sqrt(var + 1e-5) * lw[c] + lb[c],
                  1e-5);
    }
  }
  EXPECT_THROW(RMSNorm(0), InvalidArgument);
  EXPECT_EQ(LayerNorm(4, 1e-5, /*bias=*/false).named_parameters().size(), 1u);
}

TEST(DropoutTest, ScalesKeptElementsAndIsIdentityInEval) {
  Generator gen(1);
  Dropout drop(0.25, &gen);
  const Tensor x = ones({10000});
  const auto y = to_vector<float>(drop(x));
  int kept = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6) << v;
    kept += v != 0.0f;
  }
  EXPECT_NEAR(kept / 10000.0, 0.75, 0.03);  // 6 sigma of a binomial(10000, 0.75) is 0.026
  drop.eval();
  EXPECT_EQ(to_vector<float>(drop(x)), to_vector<float>(x));
  EXPECT_EQ(to_vector<float>(Dropout(0.0)(x)), to_vector<float>(x));
  EXPECT_THROW(Dropout(1.0), InvalidArgument);
}

// The FSDP pattern: a pre-hook swaps a gathered full weight into the slot for forward and a
// post-hook swaps the shard back; the gradient reaches the tensor that forward used.
TEST(ModuleHooksTest, SwappedParameterReceivesTheGradient) {
  Generator gen(2);
  Linear layer({.in_features = 3, .out_features = 2, .bias = false}, &gen);
  const Tensor shard = layer.weight();
  Tensor full = mul(ones({2, 3}), 0.5).set_requires_grad(true);
  std::vector<std::string> order;
  layer.register_forward_pre_hook([&](Module& m, Tensors&) {
    order.push_back("gather");
    m.set_parameter("weight", full);
  });
  layer.register_forward_hook([&](Module& m, const Tensors&, Tensors&) {
    order.push_back("reshard");
    m.set_parameter("weight", shard);
  });
  const Tensor x = from_vector<float>({1, 2, 3}, {1, 3});
  backward(sum(layer(x)));
  EXPECT_EQ(order, (std::vector<std::string>{"gather", "reshard"}));
  EXPECT_EQ(layer.weight().impl_ptr(), shard.impl_ptr());
  ASSERT_TRUE(full.grad().defined());
  EXPECT_EQ(to_vector<float>(full.grad()), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_FALSE(shard.grad().defined());
}

}  // namespace
}  // namespace tessel::nn
