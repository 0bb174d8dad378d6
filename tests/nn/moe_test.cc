// The MoE layer: the router's top-k against a host reference, dropless routing, forward and
// gradients against a naive per-token implementation, bias balancing, the auxiliary loss by
// hand, bad options, and the tiny DeepSeek-like Llama.

#include "tessel/nn/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/nn/llama.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

MoEOptions small_options() {
  return MoEOptions{.dim = 12, .hidden_dim = 10, .num_experts = 5, .top_k = 2};
}

void expect_close(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<float> va = to_vector<float>(contiguous(a));
  const std::vector<float> vb = to_vector<float>(contiguous(b));
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_NEAR(va[i], vb[i], tol * (1 + std::abs(vb[i]))) << "at " << i;
  }
}

// Host reference scores (N, E) of the router, in double.
std::vector<double> reference_scores(MoE& moe, const Tensor& x) {
  const int64_t N = x.size(0), C = x.size(1), E = moe.options().num_experts;
  const std::vector<float> xv = to_vector<float>(contiguous(x));
  const std::vector<float> wv = to_vector<float>(moe.parameter("gate.weight"));
  std::vector<double> s(static_cast<size_t>(N * E));
  for (int64_t t = 0; t < N; ++t) {
    double mx = -1e300;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t c = 0; c < C; ++c) l += double(xv[t * C + c]) * wv[e * C + c];
      s[t * E + e] = l;
      mx = std::max(mx, l);
    }
    double z = 0;
    for (int64_t e = 0; e < E; ++e) {
      double& v = s[t * E + e];
      v = moe.options().score == MoEScore::kSoftmax ? std::exp(v - mx) : 1 / (1 + std::exp(-v));
      z += v;
    }
    if (moe.options().score == MoEScore::kSoftmax) {
      for (int64_t e = 0; e < E; ++e) s[t * E + e] /= z;
    }
  }
  return s;
}

class MoERouterTest : public ::testing::TestWithParam<MoEScore> {};

TEST_P(MoERouterTest, TopKMatchesReference) {
  MoEOptions o = small_options();
  o.score = GetParam();
  Generator gen(1);
  MoE moe(o, &gen);
  const Tensor x = randn({9, o.dim}, gen);
  const Tensors r = moe.route(x);
  const std::vector<double> s = reference_scores(moe, x);
  const std::vector<int64_t> experts = to_vector<int64_t>(r[0]);
  const std::vector<float> weights = to_vector<float>(contiguous(r[1]));
  for (int64_t t = 0; t < 9; ++t) {
    std::vector<int64_t> order(o.num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return s[t * 5 + a] > s[t * 5 + b]; });
    const double total = s[t * 5 + order[0]] + s[t * 5 + order[1]];
    for (int64_t j = 0; j < 2; ++j) {
      EXPECT_EQ(experts[t * 2 + j], order[j]) << "token " << t;
      EXPECT_NEAR(weights[t * 2 + j], s[t * 5 + order[j]] / total, 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Scores, MoERouterTest,
                         ::testing::Values(MoEScore::kSoftmax, MoEScore::kSigmoid));

TEST(MoETest, DroplessRunsEveryAssignment_CapacityDrops) {
  Generator gen(2);
  MoE moe(small_options(), &gen);
  const Tensor x = randn({3, 7, 12}, gen);
  const Tensor y = moe(Tensors{x})[0];
  EXPECT_EQ(y.shape(), x.shape());
  const std::vector<int64_t>& counts = moe.expert_counts();
  ASSERT_EQ(counts.size(), 5u);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 21 * 2);
  EXPECT_EQ(moe.dropped(), 0);

  MoEOptions o = small_options();
  o.capacity_factor = 0.5;  // capacity ceil(0.5 * 42 / 5) = 5
  Generator gen2(2);
  MoE capped(o, &gen2);
  capped(Tensors{x});
  int64_t kept = 0;
  for (int64_t c : capped.expert_counts()) {
    EXPECT_LE(c, 5);
    kept += c;
  }
  EXPECT_GT(capped.dropped(), 0);
  EXPECT_EQ(kept + capped.dropped(), 42);
}

// The layer token by token: each token's k experts as plain matmuls, weighted and summed.
Tensor naive_moe(MoE& moe, const Tensor& x) {
  const MoEOptions& o = moe.options();
  const int64_t N = x.size(0);
  const Tensor logits = linear(x, moe.parameter("gate.weight"));
  const Tensor scores = o.score == MoEScore::kSoftmax ? softmax(logits, -1) : sigmoid(logits);
  const std::vector<float> s = to_vector<float>(contiguous(detach(scores)));
  const std::vector<float> bias = to_vector<float>(moe.buffer("expert_bias"));
  std::vector<Tensor> rows;
  for (int64_t t = 0; t < N; ++t) {
    std::vector<int64_t> order(o.num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return s[t * o.num_experts + a] + bias[a] > s[t * o.num_experts + b] + bias[b];
    });
    const Tensor xt = narrow(x, 0, t, 1);
    std::vector<Tensor> w;
    for (int64_t j = 0; j < o.top_k; ++j) w.push_back(narrow(select(scores, 0, t), 0, order[j], 1));
    Tensor total = w[0];
    for (int64_t j = 1; j < o.top_k; ++j) total = add(total, w[j]);
    Tensor yt = zeros({1, o.dim});
    for (int64_t j = 0; j < o.top_k; ++j) {
      const int64_t e = order[j];
      const Tensor h =
          kernels::swiglu_reference(matmul(xt, select(moe.parameter("experts.gate_proj"), 0, e)),
                                    matmul(xt, select(moe.parameter("experts.up_proj"), 0, e)));
      const Tensor weight = o.norm_topk ? div(w[j], total) : w[j];
      yt = add(yt, mul(matmul(h, select(moe.parameter("experts.down_proj"), 0, e)), weight));
    }
    rows.push_back(yt);
  }
  Tensor y = cat(rows, 0);
  if (o.shared_experts > 0) y = add(y, moe.child("shared_experts")(x));
  return y;
}

TEST(MoETest, ForwardAndGradientsMatchPerTokenReference) {
  for (const MoEScore score : {MoEScore::kSoftmax, MoEScore::kSigmoid}) {
    MoEOptions o = small_options();
    o.score = score;
    o.shared_experts = 1;
    o.top_k = 3;
    Generator gen(3);
    MoE moe(o, &gen);
    Tensor x = randn({11, o.dim}, gen);
    x.set_requires_grad(true);
    const Tensor dy = randn({11, o.dim}, gen);
    backward(moe(Tensors{x})[0], dy);
    std::vector<Tensor> grads{x.grad()};
    for (Tensor& p : moe.parameters()) grads.push_back(p.grad());

    Tensor x2 = detach(x);
    x2.set_requires_grad(true);
    for (Tensor& p : moe.parameters()) p.set_grad(Tensor());
    const Tensor y2 = naive_moe(moe, x2);
    expect_close(moe(Tensors{x2})[0], y2, 1e-5);
    backward(y2, dy);
    expect_close(grads[0], x2.grad(), 1e-5);
    size_t i = 1;
    for (Tensor& p : moe.parameters()) expect_close(grads[i++], p.grad(), 1e-5);
  }
}

TEST(MoETest, BiasChangesSelectionNotWeights) {
  MoEOptions o = small_options();
  o.bias_update_speed = 0.25;
  Generator gen(4);
  MoE moe(o, &gen);
  const Tensor x = randn({8, o.dim}, gen);
  {
    NoGradGuard no_grad;
    copy_(moe.buffer("expert_bias"), from_vector<float>({0, 0, 0, 0, 10}));
  }
  const Tensors r = moe.route(x);
  const std::vector<int64_t> experts = to_vector<int64_t>(r[0]);
  const std::vector<double> s = reference_scores(moe, x);
  const std::vector<float> weights = to_vector<float>(contiguous(r[1]));
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(experts[t * 2], 4) << "token " << t;  // the bias wins the first slot
    const int64_t other = experts[t * 2 + 1];
    const double total = s[t * 5 + 4] + s[t * 5 + other];
    EXPECT_NEAR(weights[t * 2], s[t * 5 + 4] / total, 1e-5);  // unbiased scores weigh
  }
  // Gradients keep their form: the per-token reference with the same biased choice agrees.
  Tensor x1 = detach(x);
  x1.set_requires_grad(true);
  backward(sum(moe(Tensors{x1})[0]));
  Tensor x2 = detach(x);
  x2.set_requires_grad(true);
  backward(sum(naive_moe(moe, x2)));
  expect_close(x1.grad(), x2.grad(), 1e-5);
  // Expert 4 took all 8 tokens' first slot: overloaded, its bias goes down, the others' up.
  moe.update_expert_bias();
  const std::vector<float> bias = to_vector<float>(moe.buffer("expert_bias"));
  EXPECT_FLOAT_EQ(bias[4], 9.75f);
  for (int64_t e = 0; e < 4; ++e) {
    const double load = static_cast<double>(moe.expert_counts()[e]);
    EXPECT_FLOAT_EQ(bias[e], load < 16.0 / 5 ? 0.25f : (load > 16.0 / 5 ? -0.25f : 0.0f));
  }
}

TEST(MoETest, AuxLossMatchesHandComputation) {
  MoEOptions o = small_options();
  o.aux_loss_coeff = 0.1;
  Generator gen(5);
  MoE moe(o, &gen);
  const Tensor x = randn({6, o.dim}, gen);
  const Tensors out = moe(Tensors{x});
  const std::vector<double> s = reference_scores(moe, x);
  const std::vector<int64_t>& counts = moe.expert_counts();
  double expected = 0;
  for (int64_t e = 0; e < 5; ++e) {
    double p = 0;
    for (int64_t t = 0; t < 6; ++t) p += s[t * 5 + e] / 6;
    expected += (counts[e] / 12.0) * p;
  }
  expected *= 0.1 * 5;
  EXPECT_NEAR(to_vector<float>(out[1])[0], expected, 1e-6);
  // Without a coefficient the loss is a plain zero.
  MoE plain(small_options(), &gen);
  EXPECT_EQ(to_vector<float>(plain(Tensors{x})[1])[0], 0.0f);
}

TEST(MoETest, BadOptionsNameTheValue) {
  auto message = [](MoEOptions o) {
    try {
      MoE moe(o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  MoEOptions o = small_options();
  o.top_k = 6;
  EXPECT_NE(message(o).find("got 6"), std::string::npos) << message(o);
  o.top_k = 0;
  EXPECT_NE(message(o).find("got 0"), std::string::npos) << message(o);
  o = small_options();
  o.num_experts = 0;
  EXPECT_NE(message(o).find("num_experts (0)"), std::string::npos) << message(o);
  o = small_options();
  o.capacity_factor = -1;
  EXPECT_NE(message(o).find("capacity_factor (-1)"), std::string::npos) << message(o);
  MoE moe(small_options());
  EXPECT_THROW(moe(Tensors{zeros({3, 11})}), InvalidArgument);
}

TEST(LlamaMoETest, TinyMoeForwardBackward) {
  LlamaConfig c = LlamaConfig::tiny_moe();
  Llama model(c);
  EXPECT_EQ(model.num_parameters(), c.num_parameters());
  ASSERT_EQ(model.moe_layers().size(), 1u);
  Generator gen(6);
  const Tensor tokens = to(mul(rand({2, 8}, gen), 255.0), DType::kI64);
  const Tensors out = model(Tensors{tokens});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 8, 256}));
  EXPECT_GT(to_vector<float>(out[1])[0], 0.0f);
  backward(add(Llama::loss(out[0], tokens), out[1]));
  EXPECT_TRUE(model.parameter("model.layers.1.mlp.experts.gate_proj").grad().defined());
  EXPECT_TRUE(model.parameter("model.layers.1.mlp.gate.weight").grad().defined());
  const std::vector<int64_t>& counts = model.moe_layers()[0]->expert_counts();
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 16 * 2);
  model.moe_layers()[0]->update_expert_bias();
  // A dense config keeps its single output.
  Llama dense(LlamaConfig::tiny());
  EXPECT_EQ(dense(Tensors{tokens}).size(), 1u);
}

}  // namespace
}  // namespace tessel::nn
