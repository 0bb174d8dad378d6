// A small GPT's loss and every parameter gradient after one forward/backward, against an
// independent reference: the same model written below with plain double-precision loops (no
// tessel ops), forward and hand-derived backward, in the style of llm.c.

#include "tessel/nn/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/storage.h"

namespace tessel::nn {
namespace {

using Vec = std::vector<double>;

// ---- The reference model (double precision loops)
// ------------------------------------------------

void layernorm_forward(Vec& out, Vec& mean, Vec& rstd, const Vec& in, const Vec& w, const Vec& b,
                       int N, int C) {
  for (int n = 0; n < N; ++n) {
    const double* x = &in[n * C];
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(Vec& din, Vec& dw, Vec& db, const Vec& dout, const Vec& in, const Vec& w,
                        const Vec& mean, const Vec& rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const double norm = (in[n * C + c] - mean[n]) * rstd[n];
      const double dnorm = w[c] * dout[n * C + c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (in[n * C + c] - mean[n]) * rstd[n];
      const double dnorm = w[c] * dout[n * C + c];
      db[c] += dout[n * C + c];
      dw[c] += norm * dout[n * C + c];
      din[n * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
    }
  }
}

// out (N, OC) = in (N, C) @ w (OC, C)^T + b (OC); b may be empty.
void matmul_forward(Vec& out, const Vec& in, const Vec& w, const Vec& b, int N, int C, int OC) {
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double acc = b.empty() ? 0.0 : b[o];
      for (int c = 0; c < C; ++c) acc += in[n * C + c] * w[o * C + c];
      out[n * OC + o] = acc;
    }
  }
}

void matmul_backward(Vec& din, Vec& dw, Vec* db, const Vec& dout, const Vec& in, const Vec& w,
                     int N, int C, int OC) {
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      const double d = dout[n * OC + o];
      for (int c = 0; c < C; ++c) {
        din[n * C + c] += d * w[o * C + c];
        dw[o * C + c] += d * in[n * C + c];
      }
      if (db) (*db)[o] += d;
    }
  }
}

// qkv (B, T, 3C) -> out (B, T, C); att (B, NH, T, T) keeps the softmax for backward.
void attention_forward(Vec& out, Vec& att, const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < NH; ++h) {
        const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
        double* a = &att[((b * NH + h) * T + t) * T];
        double maxv = -1e300;
        for (int s = 0; s <= t; ++s) {
          const double* k = &qkv[(b * T + s) * 3 * C + C + h * hs];
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          a[s] = dot * scale;
          maxv = std::max(maxv, a[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; ++s) sum += (a[s] = std::exp(a[s] - maxv));
        for (int s = 0; s < T; ++s) a[s] = s <= t ? a[s] / sum : 0.0;
        double* o = &out[(b * T + t) * C + h * hs];
        for (int i = 0; i < hs; ++i) {
          double acc = 0;
          for (int s = 0; s <= t; ++s) acc += a[s] * qkv[(b * T + s) * 3 * C + 2 * C + h * hs + i];
          o[i] = acc;
        }
      }
    }
  }
}

void attention_backward(Vec& dqkv, const Vec& dout, const Vec& qkv, const Vec& att, int B, int T,
                        int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Vec datt(T), dpre(T);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < NH; ++h) {
        const double* a = &att[((b * NH + h) * T + t) * T];
        const double* d = &dout[(b * T + t) * C + h * hs];
        // Through out = att @ v.
        for (int s = 0; s <= t; ++s) {
          const int v_at = (b * T + s) * 3 * C + 2 * C + h * hs;
          datt[s] = 0;
          for (int i = 0; i < hs; ++i) {
            datt[s] += qkv[v_at + i] * d[i];
            dqkv[v_at + i] += a[s] * d[i];
          }
        }
        // Through the softmax.
        for (int s = 0; s <= t; ++s) {
          dpre[s] = 0;
          for (int r = 0; r <= t; ++r) dpre[s] += a[r] * ((r == s ? 1.0 : 0.0) - a[s]) * datt[r];
        }
        // Through q . k * scale.
        const int q_at = (b * T + t) * 3 * C + h * hs;
        for (int s = 0; s <= t; ++s) {
          const int k_at = (b * T + s) * 3 * C + C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dqkv[q_at + i] += qkv[k_at + i] * dpre[s] * scale;
            dqkv[k_at + i] += qkv[q_at + i] * dpre[s] * scale;
          }
        }
      }
    }
  }
}

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluScale * (x + 0.044715 * x * x * x)));
}

double gelu_grad(double x) {
  const double u = kGeluScale * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  const double du = kGeluScale * (1.0 + 3 * 0.044715 * x * x);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

struct RefResult {
  double loss = 0;
  std::map<std::string, Vec> grads;
};

// The GPT-2 forward and backward for tokens/targets (B, T) with parameters `p` (by name).
RefResult reference_gpt(const GptConfig& cfg, const std::map<std::string, Vec>& p,
                        const std::vector<int64_t>& tokens, const std::vector<int64_t>& targets,
                        int B, int T) {
  const int C = static_cast<int>(cfg.n_embd), V = static_cast<int>(cfg.vocab_size);
  const int L = static_cast<int>(cfg.n_layer), NH = static_cast<int>(cfg.n_head);
  const int N = B * T;
  auto P = [&](const std::string& name) -> const Vec& { return p.at(name); };
  auto layer = [](int l, const std::string& rest) {
    return "transformer.h." + std::to_string(l) + "." + rest;
  };
  RefResult r;
  for (const auto& [name, values] : p) r.grads[name].assign(values.size(), 0.0);
  auto G = [&](const std::string& name) -> Vec& { return r.grads.at(name); };

  // Forward, keeping every activation.
  struct Layer {
    Vec in, ln1, ln1_mean, ln1_rstd, qkv, att, atty, attproj, resid2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu, fcproj;
  };
  std::vector<Layer> acts(L);
  Vec x(N * C);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      x[n * C + c] = P("transformer.wte.weight")[tokens[n] * C + c] +
                     P("transformer.wpe.weight")[(n % T) * C + c];
    }
  }
  for (int l = 0; l < L; ++l) {
    Layer& a = acts[l];
    a.in = x;
    a.ln1.resize(N * C), a.ln1_mean.resize(N), a.ln1_rstd.resize(N);
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, a.in, P(layer(l, "ln_1.weight")),
                      P(layer(l, "ln_1.bias")), N, C);
    a.qkv.resize(N * 3 * C);
    matmul_forward(a.qkv, a.ln1, P(layer(l, "attn.c_attn.weight")), P(layer(l, "attn.c_attn.bias")),
                   N, C, 3 * C);
    a.att.resize(B * NH * T * T), a.atty.resize(N * C);
    attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
    a.attproj.resize(N * C);
    matmul_forward(a.attproj, a.atty, P(layer(l, "attn.c_proj.weight")),
                   P(layer(l, "attn.c_proj.bias")), N, C, C);
    a.resid2.resize(N * C);
    for (int i = 0; i < N * C; ++i) a.resid2[i] = a.in[i] + a.attproj[i];
    a.ln2.resize(N * C), a.ln2_mean.resize(N), a.ln2_rstd.resize(N);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.resid2, P(layer(l, "ln_2.weight")),
                      P(layer(l, "ln_2.bias")), N, C);
    a.fch.resize(N * 4 * C), a.fch_gelu.resize(N * 4 * C);
    matmul_forward(a.fch, a.ln2, P(layer(l, "mlp.c_fc.weight")), P(layer(l, "mlp.c_fc.bias")), N, C,
                   4 * C);
    for (int i = 0; i < N * 4 * C; ++i) a.fch_gelu[i] = gelu(a.fch[i]);
    a.fcproj.resize(N * C);
    matmul_forward(a.fcproj, a.fch_gelu, P(layer(l, "mlp.c_proj.weight")),
                   P(layer(l, "mlp.c_proj.bias")), N, 4 * C, C);
    for (int i = 0; i < N * C; ++i) x[i] = a.resid2[i] + a.fcproj[i];
  }
  Vec lnf(N * C), lnf_mean(N), lnf_rstd(N), logits(N * V), probs(N * V);
  layernorm_forward(lnf, lnf_mean, lnf_rstd, x, P("transformer.ln_f.weight"),
                    P("transformer.ln_f.bias"), N, C);
  matmul_forward(logits, lnf, P("transformer.wte.weight"), {}, N, C, V);
  for (int n = 0; n < N; ++n) {
    const double* z = &logits[n * V];
    const double m = *std::max_element(z, z + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    for (int v = 0; v < V; ++v) probs[n * V + v] = std::exp(z[v] - m) / sum;
    r.loss += -std::log(probs[n * V + targets[n]]) / N;
  }

  // Backward.
  Vec dlogits(N * V);
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < V; ++v) {
      dlogits[n * V + v] = (probs[n * V + v] - (v == targets[n] ? 1.0 : 0.0)) / N;
    }
  }
  Vec dlnf(N * C, 0.0), dx(N * C, 0.0);
  matmul_backward(dlnf, G("transformer.wte.weight"), nullptr, dlogits, lnf,
                  P("transformer.wte.weight"), N, C, V);
  layernorm_backward(dx, G("transformer.ln_f.weight"), G("transformer.ln_f.bias"), dlnf, x,
                     P("transformer.ln_f.weight"), lnf_mean, lnf_rstd, N, C);
  for (int l = L - 1; l >= 0; --l) {
    Layer& a = acts[l];
    // x_out = resid2 + fcproj: dx flows to both.
    Vec dresid2 = dx, dfch_gelu(N * 4 * C, 0.0), dfch(N * 4 * C), dln2(N * C, 0.0);
    matmul_backward(dfch_gelu, G(layer(l, "mlp.c_proj.weight")), &G(layer(l, "mlp.c_proj.bias")),
                    dx, a.fch_gelu, P(layer(l, "mlp.c_proj.weight")), N, 4 * C, C);
    for (int i = 0; i < N * 4 * C; ++i) dfch[i] = dfch_gelu[i] * gelu_grad(a.fch[i]);
    matmul_backward(dln2, G(layer(l, "mlp.c_fc.weight")), &G(layer(l, "mlp.c_fc.bias")), dfch,
                    a.ln2, P(layer(l, "mlp.c_fc.weight")), N, C, 4 * C);
    layernorm_backward(dresid2, G(layer(l, "ln_2.weight")), G(layer(l, "ln_2.bias")), dln2,
                       a.resid2, P(layer(l, "ln_2.weight")), a.ln2_mean, a.ln2_rstd, N, C);
    // resid2 = in + attproj.
    Vec din = dresid2, datty(N * C, 0.0), dqkv(N * 3 * C, 0.0), dln1(N * C, 0.0);
    matmul_backward(datty, G(layer(l, "attn.c_proj.weight")), &G(layer(l, "attn.c_proj.bias")),
                    dresid2, a.atty, P(layer(l, "attn.c_proj.weight")), N, C, C);
    attention_backward(dqkv, datty, a.qkv, a.att, B, T, C, NH);
    matmul_backward(dln1, G(layer(l, "attn.c_attn.weight")), &G(layer(l, "attn.c_attn.bias")), dqkv,
                    a.ln1, P(layer(l, "attn.c_attn.weight")), N, C, 3 * C);
    layernorm_backward(din, G(layer(l, "ln_1.weight")), G(layer(l, "ln_1.bias")), dln1, a.in,
                       P(layer(l, "ln_1.weight")), a.ln1_mean, a.ln1_rstd, N, C);
    dx = din;
  }
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      G("transformer.wte.weight")[tokens[n] * C + c] += dx[n * C + c];
      G("transformer.wpe.weight")[(n % T) * C + c] += dx[n * C + c];
    }
  }
  return r;
}

// ---- Tests
// -----------------------------------------------------------------------------------------

Vec to_double(const Tensor& t) {
  const std::vector<float> f = to_vector<float>(t);
  return Vec(f.begin(), f.end());
}

// Parameters far from GPT-2's small initialisation, so every path carries signal.
StateDict random_state(const GPT& model, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  StateDict state;
  for (const auto& [name, t] : model.state_dict()) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    const bool norm_weight = name.find(".ln_") != std::string::npos && name.ends_with(".weight");
    for (float& x : v) x = norm_weight ? 1.0f + 0.3f * dist(rng) : 0.3f * dist(rng);
    state.emplace(name, from_vector<float>(v, t.shape()));
  }
  return state;
}

// n tokens and n targets drawn from the vocabulary.
std::pair<std::vector<int64_t>, std::vector<int64_t>> random_tokens(const GptConfig& cfg, int64_t n,
                                                                    uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> tokens(n), targets(n);
  for (auto& x : tokens) x = static_cast<int64_t>(rng() % cfg.vocab_size);
  for (auto& x : targets) x = static_cast<int64_t>(rng() % cfg.vocab_size);
  return {tokens, targets};
}

struct GptCase {
  int B, T;
  GptConfig config;
};

class GptReferenceTest : public testing::TestWithParam<GptCase> {};

TEST_P(GptReferenceTest, LossAndEveryGradientMatchTheLoopReference) {
  const auto [B, T, cfg] = GetParam();
  GPT model(cfg);
  model.load_state_dict(random_state(model, 7));
  const auto [tokens, targets] = random_tokens(cfg, B * T, 11);

  const Tensor logits = model(from_vector<int64_t>(tokens, {B, T}));
  ASSERT_EQ(logits.shape(), (Shape{B, T, cfg.vocab_size}));
  const Tensor loss = GPT::loss(logits, from_vector<int64_t>(targets, {B, T}));
  backward(loss);

  std::map<std::string, Vec> params;
  for (const auto& [name, t] : model.state_dict()) params[name] = to_double(t);
  const RefResult ref = reference_gpt(cfg, params, tokens, targets, B, T);

  EXPECT_NEAR(item(loss), ref.loss, 1e-5 * ref.loss);
  const auto named = model.named_parameters();
  ASSERT_EQ(named.size(), ref.grads.size());
  for (const auto& [name, p] : named) {
    ASSERT_TRUE(p.grad().defined()) << name;
    const Vec got = to_double(p.grad());
    const Vec& want = ref.grads.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4 * scale + 1e-7) << name << " element " << i;
    }
  }
}

// The same model under bf16 autocast: GEMMs and attention in bf16 with f32 accumulation, norms,
// softmax and the loss in f32, parameters and their gradients f32.
TEST_P(GptReferenceTest, UnderBf16AutocastWithinBf16ToleranceOfTheReference) {
  const auto [B, T, cfg] = GetParam();
  GPT model(cfg);
  model.load_state_dict(random_state(model, 7));
  const auto [tokens, targets] = random_tokens(cfg, B * T, 11);

  Tensor loss;
  {
    AutocastGuard autocast(DType::kBF16);
    const Tensor logits = model(from_vector<int64_t>(tokens, {B, T}));
    EXPECT_EQ(logits.dtype(), DType::kBF16);
    loss = GPT::loss(logits, from_vector<int64_t>(targets, {B, T}));
  }
  EXPECT_EQ(loss.dtype(), DType::kF32);
  backward(loss);

  std::map<std::string, Vec> params;
  for (const auto& [name, t] : model.state_dict()) params[name] = to_double(t);
  const RefResult ref = reference_gpt(cfg, params, tokens, targets, B, T);
  // Tolerances: every GEMM input and attention probability is rounded to bf16 (2^-8 relative
  // at most) and the errors of the layers add up; measured at most 0.04% for the loss and 3.4%
  // (relative L2 over a parameter's gradient) at these shapes.
  EXPECT_NEAR(item(loss), ref.loss, 2e-3 * ref.loss);
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::kF32) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::kF32) << name;
    const Vec got = to_double(p.grad());
    const Vec& want = ref.grads.at(name);
    double err = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    if (norm == 0) continue;  // position rows no token reached
    EXPECT_LT(std::sqrt(err / norm), 8e-2) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptReferenceTest,
    testing::Values(
        // T below block_size: the unused position rows must get zero gradient.
        GptCase{
            2,
            5,
            {.vocab_size = 13, .block_size = 7, .n_layer = 2, .n_head = 2, .n_embd = 8, .seed = 1}},
        GptCase{
            1,
            1,
            {.vocab_size = 5, .block_size = 3, .n_layer = 1, .n_head = 1, .n_embd = 4, .seed = 2}},
        GptCase{3,
                4,
                {.vocab_size = 17,
                 .block_size = 4,
                 .n_layer = 3,
                 .n_head = 3,
                 .n_embd = 12,
                 .seed = 3}}),
    [](const auto& info) {
      return fmt::format("B{}_T{}_L{}_H{}_C{}", info.param.B, info.param.T,
                         info.param.config.n_layer, info.param.config.n_head,
                         info.param.config.n_embd);
    });

// Mixed-precision training: AdamW on f32 master weights with forward under bf16 autocast
// memorises a batch as f32 training does, and parameters and optimizer state stay f32.
TEST(GptAutocastTest, TrainsLikeF32OnF32MasterWeightsAndOptimizerState) {
  const GptConfig cfg{
      .vocab_size = 32, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .seed = 5};
  const int64_t B = 4, T = 16;
  const auto [tokens, targets] = random_tokens(cfg, B * T, 3);
  const Tensor x = from_vector<int64_t>(tokens, {B, T}), y = from_vector<int64_t>(targets, {B, T});
  auto train = [&](bool bf16) {
    GPT model(cfg);
    optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
    std::vector<double> losses;
    for (int step = 0; step < 40; ++step) {
      Tensor loss;
      {
        std::optional<AutocastGuard> autocast;
        if (bf16) autocast.emplace(DType::kBF16);
        loss = GPT::loss(model(x), y);
      }
      losses.push_back(item(loss));
      backward(loss);
      opt.step();
      opt.zero_grad();
    }
    for (size_t i = 0; i < model.parameters().size(); ++i) {
      EXPECT_EQ(model.parameters()[i].dtype(), DType::kF32);
      EXPECT_EQ(opt.exp_avg(i).dtype(), DType::kF32);
      EXPECT_EQ(opt.exp_avg_sq(i).dtype(), DType::kF32);
    }
    return losses;
  };
  const std::vector<double> f32 = train(false), bf16 = train(true);
  EXPECT_NEAR(bf16.front(), f32.front(), 2e-3 * f32.front());
  // Random targets over 32 classes start near ln 32 = 3.47; 40 steps memorise them (measured
  // 0.0232 in f32 and 0.0235 in bf16).
  EXPECT_LT(f32.back(), 0.1 * f32.front());
  EXPECT_LT(bf16.back(), 0.1 * bf16.front());
  EXPECT_NEAR(bf16.back(), f32.back(), 0.05 * f32.back());
}

TEST(GptTest, NamesFollowTheGpt2LayoutWithATiedHead) {
  GPT model({.vocab_size = 11, .block_size = 4, .n_layer = 2, .n_head = 2, .n_embd = 8});
  const StateDict state = model.state_dict();
  for (const char* name : {"transformer.wte.weight", "transformer.wpe.weight",
                           "transformer.h.0.ln_1.weight", "transformer.h.1.attn.c_attn.weight",
                           "transformer.h.1.attn.c_proj.bias", "transformer.h.0.mlp.c_fc.weight",
                           "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.bias"}) {
    EXPECT_EQ(state.count(name), 1u) << name;
  }
  EXPECT_EQ(state.count("lm_head.weight"), 0u);  // tied to wte
  EXPECT_EQ(state.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{24, 8}));
  // 2 embeddings + per block (2 norms x 2 + 4 linears x 2) + final norm x 2.
  EXPECT_EQ(state.size(), 2u + 2u * 12u + 2u);
  const int64_t C = 8;
  EXPECT_EQ(
      model.num_parameters(),
      11 * C + 4 * C + 2 * (4 * C + 3 * C * C + 3 * C + C * C + C + 8 * C * C + 5 * C) + 2 * C);
}

TEST(GptTest, SameSeedSameModel) {
  const GptConfig cfg{
      .vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8, .seed = 5};
  GPT a(cfg), b(cfg);
  for (const auto& [name, t] : a.state_dict()) {
    EXPECT_EQ(to_vector<float>(t), to_vector<float>(b.state_dict().at(name))) << name;
  }
}

TEST(GptTest, RejectsBadInput) {
  GPT model({.vocab_size = 11, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8});
  EXPECT_THROW(model(zeros({1, 5}, DType::kI64)), InvalidArgument);  // longer than block_size
  EXPECT_THROW(model(zeros({1, 3})), InvalidArgument);               // float tokens
  EXPECT_THROW(model(full({1, 3}, 11, DType::kI64)), OutOfRange);    // outside the vocabulary
  EXPECT_THROW(GPT({.n_head = 3, .n_embd = 8}), InvalidArgument);
}

// A GPT of about a billion parameters built on the meta device allocates nothing; giving each
// parameter only rank 0's dim-0 shard of a 4-way split allocates a quarter.
TEST(GptMetaTest, BillionParameterModelAllocatesNothingAndAShardAQuarter) {
  empty_cache(Device::cpu());
  const int64_t before = memory_stats(Device::cpu()).allocated_bytes;
  const GptConfig config{
      .vocab_size = 50304, .block_size = 1024, .n_layer = 20, .n_head = 16, .n_embd = 2048};
  std::unique_ptr<GPT> model;
  {
    DefaultDeviceGuard meta(Device::meta());
    model = std::make_unique<GPT>(config);
  }
  EXPECT_GT(model->num_parameters(), 1'000'000'000);
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, before);
  for (const Tensor& p : model->parameters()) EXPECT_TRUE(p.is_meta());

  int64_t full_bytes = 0, shard_bytes = 0;
  for (const Tensor& p : model->parameters()) {
    Shape shard = p.shape();
    shard[0] = (shard[0] + 3) / 4;  // rank 0 of 4 takes the ceiling
    full_bytes += static_cast<int64_t>(p.nbytes());
    const int64_t bytes = shape_numel(shard) * static_cast<int64_t>(p.element_size());
    shard_bytes += (bytes + 63) / 64 * 64;  // the CPU allocator's 64-byte blocks
    p.set_data(empty(shard, p.dtype(), Device::cpu()));
  }
  const int64_t allocated = memory_stats(Device::cpu()).allocated_bytes - before;
  EXPECT_EQ(allocated, shard_bytes);
  EXPECT_NEAR(static_cast<double>(allocated) / static_cast<double>(full_bytes), 0.25, 0.001);
  model.reset();
  empty_cache(Device::cpu());
}

// A model built on the meta device, given memory and initialised, equals one built directly.
TEST(GptMetaTest, ToEmptyThenInitWeightsEqualsADirectBuild) {
  const GptConfig config{
      .vocab_size = 13, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .seed = 5};
  GPT direct(config);
  std::unique_ptr<GPT> later;
  {
    DefaultDeviceGuard meta(Device::meta());
    later = std::make_unique<GPT>(config);
  }
  later->to_empty(Device::cpu());
  later->init_weights();
  const auto a = direct.named_parameters(), b = later->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(to_vector<float>(a[i].second), to_vector<float>(b[i].second)) << a[i].first;
  }
}

TEST(SdpaTest, MatchesLoopsAndRejectsBadShapes) {
  // Non-causal with an explicit scale and Sq != Sk, against a direct loop.
  const int B = 1, H = 2, Sq = 3, Sk = 4, D = 2;
  Generator gen(3);
  Tensor q = randn({B, H, Sq, D}, gen), k = randn({B, H, Sk, D}, gen),
         v = randn({B, H, Sk, D}, gen);
  const Tensor out = kernels::scaled_dot_product_attention(q, k, v, {.scale = 0.7});
  const auto qv = to_vector<float>(q), kv = to_vector<float>(k), vv = to_vector<float>(v);
  const auto ov = to_vector<float>(out);
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < Sq; ++i) {
      Vec s(Sk);
      double sum = 0;
      for (int j = 0; j < Sk; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += qv[(h * Sq + i) * D + d] * kv[(h * Sk + j) * D + d];
        sum += (s[j] = std::exp(0.7 * dot));
      }
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j < Sk; ++j) acc += s[j] / sum * vv[(h * Sk + j) * D + d];
        EXPECT_NEAR(ov[(h * Sq + i) * D + d], acc, 1e-5);
      }
    }
  }
  EXPECT_THROW(kernels::scaled_dot_product_attention(q, transpose(k, 2, 3), v), InvalidArgument);
  // Causal, bottom-right aligned, 4 queries over 3 keys: query 0 sees no key and gives 0, not NaN;
  // query 3 sees every key.
  const Tensor masked = kernels::scaled_dot_product_attention(
      k, q, q, {.causal = true, .alignment = kernels::attention::MaskAlignment::kBottomRight});
  const auto mv = to_vector<float>(masked);
  for (int h = 0; h < H; ++h) {
    for (int d = 0; d < D; ++d) EXPECT_EQ(mv[(h * Sk + 0) * D + d], 0.0f);
  }
  for (float x : mv) EXPECT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace tessel::nn
