// The Llama model and its layers: Hugging Face's parameter names, grouped-query attention equal
// to multi-head attention with K/V repeated, gradients against finite differences and against
// the op-by-op model, the published presets' parameter counts on the meta device, training.

#include "tessel/nn/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/rope.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/rope.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

LlamaConfig small_config() {
  LlamaConfig c = LlamaConfig::tiny();
  c.vocab_size = 32;
  c.dim = 32;
  c.ffn_hidden_size = 48;
  c.seed = 3;
  return c;
}

Tensor random_tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator gen(seed);
  return to(mul(rand({B, T}, gen), static_cast<double>(V) - 0.01), DType::kI64);
}

TEST(LlamaTest, ParameterNamesAreHuggingFaces) {
  Llama model(LlamaConfig::tiny());
  std::vector<std::string> names;
  for (auto& [name, p] : model.named_parameters()) names.push_back(name);
  const std::vector<std::string> layer = {
      "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
      "self_attn.o_proj.weight", "mlp.gate_proj.weight",    "mlp.up_proj.weight",
      "mlp.down_proj.weight",    "input_layernorm.weight",  "post_attention_layernorm.weight"};
  std::vector<std::string> want = {"model.embed_tokens.weight"};
  for (int l = 0; l < 2; ++l) {
    for (const auto& n : layer) want.push_back("model.layers." + std::to_string(l) + "." + n);
  }
  want.push_back("model.norm.weight");
  want.push_back("lm_head.weight");
  EXPECT_EQ(names, want);
  EXPECT_TRUE(model.named_buffers().empty());  // inv_freq is not saved, as in transformers
  EXPECT_EQ(model.parameter("model.layers.0.self_attn.k_proj.weight").shape(), (Shape{32, 64}));
  EXPECT_EQ(model.parameter("model.layers.1.mlp.down_proj.weight").shape(), (Shape{64, 128}));
  EXPECT_EQ(model.num_parameters(), model.config().num_parameters());

  LlamaConfig tied = LlamaConfig::tiny();
  tied.tie_word_embeddings = true;
  Llama tied_model(tied);
  EXPECT_THROW(tied_model.parameter("lm_head.weight"), OutOfRange);
  EXPECT_EQ(tied_model.num_parameters(), tied.num_parameters());
  const Tensor logits = tied_model(random_tokens(2, 5, 256, 1));
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 256}));
}

TEST(LlamaTest, PresetsOnMetaMatchPublishedCounts) {
  struct Case {
    LlamaConfig config;
    int64_t exact;     // from the published config.json shapes
    double published;  // the model card's figure
  };
  const std::vector<Case> cases = {{LlamaConfig::llama3_2_1b(), 1235814400, 1.24e9},
                                   {LlamaConfig::llama3_1_8b(), 8030261248, 8.03e9},
                                   {LlamaConfig::llama3_1_70b(), 70553706496, 70.6e9}};
  for (const Case& c : cases) {
    DefaultDeviceGuard meta(Device::meta());
    Llama model(c.config);
    for (const Tensor& p : model.parameters()) ASSERT_TRUE(p.is_meta());
    EXPECT_EQ(model.num_parameters(), c.exact);
    EXPECT_EQ(c.config.num_parameters(), c.exact);
    EXPECT_NEAR(double(c.exact) / c.published, 1.0, 0.005);
    const LlamaMemoryEstimate e = estimate_llama_memory(c.config);  // bf16 + f32 moments
    EXPECT_EQ(e.total_bytes(), c.exact * (2 + 2 + 8));
  }
  // Meta's hidden-size rule gives the published sizes: 8B (x1.3, 1024) and 70B (x1.3, 4096).
  LlamaConfig rule = LlamaConfig::llama3_1_8b();
  rule.ffn_hidden_size = 0;
  rule.ffn_dim_multiplier = 1.3;
  rule.multiple_of = 1024;
  EXPECT_EQ(rule.ffn_hidden(), 14336);
  rule = LlamaConfig::llama3_1_70b();
  rule.ffn_hidden_size = 0;
  rule.ffn_dim_multiplier = 1.3;
  rule.multiple_of = 4096;
  EXPECT_EQ(rule.ffn_hidden(), 28672);
}

TEST(LlamaTest, GroupedQueryAttentionEqualsMultiHeadWithRepeatedKV) {
  Generator gen(21);
  const int64_t C = 32, H = 4, Hkv = 2, D = 8, B = 2, T = 7;
  LlamaAttention gqa({.dim = C, .n_heads = H, .n_kv_heads = Hkv}, &gen);
  LlamaAttention mha({.dim = C, .n_heads = H, .n_kv_heads = H}, &gen);
  {
    // Query head h uses K/V head h / (H / Hkv): repeat each K/V head's rows H / Hkv times.
    NoGradGuard no_grad;
    for (const char* name : {"q_proj.weight", "o_proj.weight"}) {
      copy_(mha.parameter(name), gqa.parameter(name));
    }
    for (const char* name : {"k_proj.weight", "v_proj.weight"}) {
      const Tensor w = reshape(gqa.parameter(name), {Hkv, 1, D, C});
      copy_(mha.parameter(name), reshape(expand(w, {Hkv, H / Hkv, D, C}), {H * D, C}));
    }
  }
  RotaryEmbedding rotary(D, 10000.0);
  const Tensors cs = rotary(Tensors{add(arange(T), 5.0)});
  const Tensor x0 = randn({B, T, C}, gen);
  Tensor x1 = clone(x0).set_requires_grad(true), x2 = clone(x0).set_requires_grad(true);
  const Tensor y1 = gqa({x1, cs[0], cs[1]})[0];
  const Tensor y2 = mha({x2, cs[0], cs[1]})[0];
  const auto a = to_vector<float>(y1), b = to_vector<float>(y2);
  ASSERT_EQ(a.size(), size_t(B * T * C));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << i;
  const Tensor g = randn({B, T, C}, gen);
  backward(sum(mul(y1, g)));
  backward(sum(mul(y2, g)));
  const auto ga = to_vector<float>(x1.grad()), gb = to_vector<float>(x2.grad());
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-5) << i;
  // The shared K weight's gradient is the sum over its repeated copies.
  const Tensor summed =
      sum(reshape(mha.parameter("k_proj.weight").grad(), {Hkv, H / Hkv, D, C}), {1});
  const auto sk = to_vector<float>(summed),
             gk = to_vector<float>(gqa.parameter("k_proj.weight").grad());
  for (size_t i = 0; i < sk.size(); ++i) ASSERT_NEAR(sk[i], gk[i], 1e-5) << i;
  EXPECT_THROW(LlamaAttention({.dim = 32, .n_heads = 4, .n_kv_heads = 3}), InvalidArgument);
}

// The same model written with the op-by-op references (rope_reference, swiglu_reference, the
// RMSNorm formula, explicit K/V repetition and a masked softmax): the fused model must match it.
Tensor reference_logits(Llama& m, const Tensor& tokens) {
  const LlamaConfig& c = m.config();
  const int64_t B = tokens.size(0), T = tokens.size(1), D = c.head_size();
  const int64_t H = c.n_heads, Hkv = c.kv_heads();
  auto norm = [&](const Tensor& x, const std::string& name) {
    return mul(mul(x, rsqrt(add(mean(mul(x, x), {-1}, true), c.norm_eps))), m.parameter(name));
  };
  const kernels::RopeTables cs =
      kernels::rope_tables(arange(T), kernels::rope_inv_freq(D, c.rope_theta, c.rope_scaling));
  Tensor mask = zeros({T, T});
  {
    std::vector<float> mv(T * T);
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < T; ++j) mv[i * T + j] = j <= i ? 0.0f : -1e30f;
    }
    mask = from_vector<float>(mv, {T, T});
  }
  Tensor x = embedding(m.parameter("model.embed_tokens.weight"), tokens);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Tensor h = norm(x, p + "input_layernorm.weight");
    auto proj = [&](const char* n, int64_t heads) {
      return reshape(linear(h, m.parameter(p + "self_attn." + n + ".weight")), {B, T, heads, D});
    };
    auto repeat = [&](const Tensor& t) {  // (B, T, Hkv, D) -> (B, H, T, D)
      const Tensor e = expand(reshape(t, {B, T, Hkv, 1, D}), {B, T, Hkv, H / Hkv, D});
      return transpose(reshape(e, {B, T, H, D}), 1, 2);
    };
    const Tensor q = transpose(kernels::rope_reference(proj("q_proj", H), cs.cos, cs.sin), 1, 2);
    const Tensor k = repeat(kernels::rope_reference(proj("k_proj", Hkv), cs.cos, cs.sin));
    const Tensor v = repeat(proj("v_proj", Hkv));
    const Tensor att = softmax(add(mul(matmul(q, transpose(k, 2, 3)), 1.0 / std::sqrt(D)), mask));
    const Tensor y = reshape(transpose(matmul(att, v), 1, 2), {B, T, H * D});
    x = add(x, linear(y, m.parameter(p + "self_attn.o_proj.weight")));
    const Tensor h2 = norm(x, p + "post_attention_layernorm.weight");
    const Tensor mid =
        kernels::swiglu_reference(linear(h2, m.parameter(p + "mlp.gate_proj.weight")),
                                  linear(h2, m.parameter(p + "mlp.up_proj.weight")));
    x = add(x, linear(mid, m.parameter(p + "mlp.down_proj.weight")));
  }
  return linear(norm(x, "model.norm.weight"), m.parameter("lm_head.weight"));
}

TEST(LlamaTest, FusedModelMatchesOpByOpModelAndFiniteDifferences) {
  Llama model(small_config());
  const Tensor tokens = random_tokens(2, 9, 32, 4), targets = random_tokens(2, 9, 32, 5);
  const Tensor loss = Llama::loss(model(tokens), targets);
  backward(loss);
  std::vector<std::pair<std::string, Tensor>> fused;
  for (auto& [name, p] : model.named_parameters()) fused.emplace_back(name, clone(p.grad()));
  model.zero_grad();
  const Tensor ref_loss = Llama::loss(reference_logits(model, tokens), targets);
  EXPECT_NEAR(item(loss), item(ref_loss), 1e-5);
  backward(ref_loss);
  for (auto& [name, g] : fused) {
    const auto a = to_vector<float>(g), b = to_vector<float>(model.parameter(name).grad());
    double scale = 1e-6;
    for (float v : b) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4 * scale) << name << " " << i;
  }
  // Central differences on a few entries of each kind of parameter.
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.1.post_attention_layernorm.weight", "lm_head.weight"}) {
    Tensor& p = model.parameter(name);
    const std::vector<float> grad = [&] {
      for (auto& [n, g] : fused)
        if (n == name) return to_vector<float>(g);
      return std::vector<float>();
    }();
    // The entry with the largest gradient, where the difference quotient is informative.
    size_t best = 0;
    for (size_t i = 0; i < grad.size(); ++i)
      if (std::abs(grad[i]) > std::abs(grad[best])) best = i;
    auto loss_with = [&](double delta) {
      NoGradGuard no_grad;
      Tensor flat = reshape(p, {p.numel()});
      Tensor entry = narrow(flat, 0, static_cast<int64_t>(best), 1);
      const double old = item(entry);
      fill_(entry, old + delta);
      const double l = item(Llama::loss(model(tokens), targets));
      fill_(entry, old);
      return l;
    };
    const double h = 1e-2;
    const double numeric = (loss_with(h) - loss_with(-h)) / (2 * h);
    EXPECT_NEAR(numeric, grad[best], 2e-3 + 0.05 * std::abs(grad[best])) << name;
  }
}

TEST(LlamaTest, ExplicitPositionsAndErrors) {
  Llama model(small_config());
  const Tensor tokens = random_tokens(2, 6, 32, 8);
  const auto a = to_vector<float>(model(tokens));
  const auto b = to_vector<float>(model(Tensors{tokens, arange(6)})[0]);
  const auto c =
      to_vector<float>(model(Tensors{tokens, reshape(cat({arange(6), arange(6)}), {2, 6})})[0]);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  // Shifted positions change the logits (RoPE is relative, but the first token sees only itself,
  // so compare a later one) only by rounding: attention depends on position differences.
  const auto d = to_vector<float>(model(Tensors{tokens, add(arange(6), 40.0)})[0]);
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max(max_diff, double(std::abs(a[i] - d[i])));
  EXPECT_LT(max_diff, 1e-4);
  EXPECT_THROW(model(Tensors{tokens, arange(5)}), InvalidArgument);
  EXPECT_THROW(model(random_tokens(1, 300, 32, 1)), InvalidArgument);  // above max_seq_len
  LlamaConfig bad = small_config();
  bad.n_kv_heads = 3;
  EXPECT_THROW(Llama{bad}, InvalidArgument);
}

TEST(LlamaTest, TrainingLowersTheLoss) {
  Llama model(small_config());
  // A learnable sequence: each token predicts the next of a fixed cycle.
  std::vector<int64_t> seq;
  for (int i = 0; i < 2 * 17; ++i) seq.push_back((i * 7) % 32);
  const Tensor data = from_vector<int64_t>(seq, {2, 17});
  const Tensor tokens = contiguous(narrow(data, 1, 0, 16));
  const Tensor targets = contiguous(narrow(data, 1, 1, 16));
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    model.zero_grad();
    const Tensor loss = Llama::loss(model(tokens), targets);
    backward(loss);
    opt.step();
    (step == 0 ? first : last) = item(loss);
  }
  EXPECT_NEAR(first, std::log(32.0), 0.5);
  EXPECT_LT(last, 0.5 * first);
}

}  // namespace
}  // namespace tessel::nn
