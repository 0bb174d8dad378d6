// The Tensor entry point: autograd gradients against the same attention composed of plain
// tensor ops (matmul, masked_fill, softmax) under the tensor core's autograd, strided inputs,
// GQA and documents, dropout reproducibility, and the dispatcher with its forcing scope.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels {
namespace {

// Composed reference: softmax(q k^T * scale + mask) v, k/v repeated over GQA groups.
// `visible` (S_q, S_k) bool-like f32 (1 visible), broadcast over batch and heads.
Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& visible,
                          double scale) {
  const int64_t group = q.size(1) / k.size(1);
  std::vector<Tensor> ks, vs;
  for (int64_t h = 0; h < q.size(1); ++h) {
    ks.push_back(narrow(k, 1, h / group, 1));
    vs.push_back(narrow(v, 1, h / group, 1));
  }
  const Tensor kk = cat(ks, 1), vv = cat(vs, 1);
  Tensor s = matmul(q, transpose(kk, 2, 3)) * scale;
  s = masked_fill(s, eq(visible, 0.0), -INFINITY);
  return matmul(softmax(s, -1), vv);
}

double max_diff(const Tensor& a, const Tensor& b) {
  return item(max(abs(sub(to(a, DType::kF32), to(b, DType::kF32)))));
}

TEST(SdpaTest, GradientsMatchComposedOpsWithGqaAndStrides) {
  Generator gen(3);
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 33, D = 16;
  // q stored as (B, S, H, D) and viewed as (B, H, S, D): non-contiguous.
  Tensor q = permute(randn({B, S, Hq, D}, gen), {0, 2, 1, 3}).set_requires_grad(true);
  Tensor k = randn({B, Hkv, S, D}, gen).set_requires_grad(true);
  Tensor v = randn({B, Hkv, S, D}, gen).set_requires_grad(true);
  Tensor g = randn({B, Hq, S, D}, gen);
  std::vector<float> vis(S * S);
  for (int64_t i = 0; i < S; ++i) {
    for (int64_t j = 0; j < S; ++j) vis[i * S + j] = j <= i && i - j <= 5 ? 1.0f : 0.0f;
  }
  const Tensor visible = from_vector(vis, {S, S});

  SdpaOptions opts;
  opts.causal = true;
  opts.window_left = 5;
  opts.scale = 0.2;
  SdpaOutput r = scaled_dot_product_attention(q, k, v, opts);
  EXPECT_EQ(r.backend, SdpaBackend::kFlashCpu);
  EXPECT_EQ(r.logsumexp.shape(), (Shape{B, Hq, S}));
  backward(sum(mul(r.output, g)));
  const Tensor dq = q.grad(), dk = k.grad(), dv = v.grad();

  Tensor q2 = detach(q).set_requires_grad(true), k2 = detach(k).set_requires_grad(true),
         v2 = detach(v).set_requires_grad(true);
  const Tensor ref = composed_attention(q2, k2, v2, visible, 0.2);
  backward(sum(mul(ref, g)));
  EXPECT_LT(max_diff(r.output, ref), 1e-5);
  EXPECT_LT(max_diff(dq, q2.grad()), 1e-4);
  EXPECT_LT(max_diff(dk, k2.grad()), 1e-4);
  EXPECT_LT(max_diff(dv, v2.grad()), 1e-4);
}

TEST(SdpaTest, DocumentsMatchComposedOps) {
  Generator gen(4);
  const int64_t S = 20, D = 8;
  Tensor q = randn({1, 2, S, D}, gen), k = randn({1, 2, S, D}, gen), v = randn({1, 2, S, D}, gen);
  std::vector<int64_t> ids(S);
  for (int64_t i = 0; i < S; ++i) ids[i] = i < 6 ? 0 : i < 15 ? 1 : 2;
  std::vector<float> vis(S * S);
  for (int64_t i = 0; i < S; ++i) {
    for (int64_t j = 0; j < S; ++j) vis[i * S + j] = ids[i] == ids[j] && j <= i;
  }
  SdpaOptions opts;
  opts.causal = true;
  opts.document_ids = from_vector(ids, {S});
  const Tensor out = scaled_dot_product_attention(q, k, v, opts);
  const Tensor ref =
      composed_attention(q, k, v, from_vector(vis, {S, S}), 1.0 / std::sqrt(double(D)));
  EXPECT_LT(max_diff(out, ref), 1e-5);

  opts.document_ids = from_vector(std::vector<int64_t>(S - 1, 0), {S - 1});
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, opts), InvalidArgument);
}

TEST(SdpaTest, DispatcherPicksFlashAndScopesForce) {
  Generator gen(5);
  Tensor q = randn({1, 2, 9, 16}, gen), k = randn({1, 2, 9, 16}, gen),
         v = randn({1, 2, 9, 16}, gen);
  EXPECT_EQ(scaled_dot_product_attention(q, k, v).backend, SdpaBackend::kFlashCpu);
  SdpaOutput flash = scaled_dot_product_attention(q, k, v);
  {
    SdpaBackendScope only_math(SdpaBackend::kMath);
    SdpaOutput math = scaled_dot_product_attention(q, k, v);
    EXPECT_EQ(math.backend, SdpaBackend::kMath);
    EXPECT_LT(max_diff(math.output, flash.output), 1e-5);
    EXPECT_LT(max_diff(math.logsumexp, flash.logsumexp), 1e-5);
    {
      // Nested scopes intersect: nothing is left.
      SdpaBackendScope only_flash(SdpaBackend::kFlashCpu);
      try {
        scaled_dot_product_attention(q, k, v);
        ADD_FAILURE() << "expected Unavailable";
      } catch (const Unavailable& e) {
        EXPECT_NE(std::string(e.what()).find("flash_cpu: excluded by an SdpaBackendScope"),
                  std::string::npos)
            << e.what();
      }
    }
    EXPECT_EQ(scaled_dot_product_attention(q, k, v).backend, SdpaBackend::kMath);
  }
  SdpaOptions opts;
  opts.backend = SdpaBackend::kMath;
  EXPECT_EQ(scaled_dot_product_attention(q, k, v, opts).backend, SdpaBackend::kMath);
  opts.backend = SdpaBackend::kFlashCuda;
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, opts), Unavailable);
}

TEST(SdpaTest, DropoutBackendsAgreeAndGeneratorAdvances) {
  Generator init(6);
  const int64_t S = 40, D = 16;
  Tensor q = randn({2, 2, S, D}, init).set_requires_grad(true);
  Tensor k = randn({2, 1, S, D}, init).set_requires_grad(true);
  Tensor v = randn({2, 1, S, D}, init).set_requires_grad(true);
  Tensor g = randn({2, 2, S, D}, init);
  std::vector<Tensor> outs, grads;
  for (SdpaBackend b : {SdpaBackend::kFlashCpu, SdpaBackend::kMath}) {
    Generator gen(77);
    SdpaOptions opts;
    opts.dropout_p = 0.3;
    opts.generator = &gen;
    opts.backend = b;
    opts.causal = true;
    const Tensor out = scaled_dot_product_attention(q, k, v, opts);
    backward(sum(mul(out, g)));
    outs.push_back(out);
    grads.push_back(clone(q.grad()));
    grads.push_back(clone(k.grad()));
    q.set_grad(Tensor());
    k.set_grad(Tensor());
    v.set_grad(Tensor());
    EXPECT_EQ(gen.offset(), uint64_t(2 * 2 * S * S));
    // A second draw from the advanced generator gives a different mask.
    const Tensor again = scaled_dot_product_attention(detach(q), detach(k), detach(v), opts);
    EXPECT_GT(max_diff(again, out), 1e-3);
  }
  EXPECT_LT(max_diff(outs[0], outs[1]), 1e-5);
  EXPECT_LT(max_diff(grads[0], grads[2]), 1e-4);
  EXPECT_LT(max_diff(grads[1], grads[3]), 1e-4);
}

TEST(SdpaTest, Bf16ThroughAutograd) {
  Generator gen(8);
  Tensor q = to(randn({1, 2, 70, 32}, gen), DType::kBF16).set_requires_grad(true);
  Tensor k = to(randn({1, 2, 70, 32}, gen), DType::kBF16).set_requires_grad(true);
  Tensor v = to(randn({1, 2, 70, 32}, gen), DType::kBF16).set_requires_grad(true);
  SdpaOptions opts;
  opts.causal = true;
  const Tensor out = scaled_dot_product_attention(q, k, v, opts);
  EXPECT_EQ(out.dtype(), DType::kBF16);
  backward(sum(to(out, DType::kF32)));
  EXPECT_EQ(q.grad().dtype(), DType::kBF16);
  // Same call in f32 for comparison: bf16 rounding only.
  const Tensor ref = scaled_dot_product_attention(
      to(detach(q), DType::kF32), to(detach(k), DType::kF32), to(detach(v), DType::kF32), opts);
  EXPECT_LT(max_diff(out, ref), 2e-2);
}

// Heads split out of one (B, S, 3·H·D) projection, as a GPT does: the output and dq, dk, dv
// come back laid out (B, S, H, D), so the heads re-assemble as views. Under autocast the call
// computes in bf16: an f32 projection is cast (a contiguous copy, so no layout to keep) and
// gets an f32 gradient; a bf16 one keeps the layout.
TEST(SdpaTest, PackedProjectionHeadsNeedNoCopiesAndAutocastComputesInBf16) {
  const int64_t B = 2, S = 40, H = 3, D = 16, C = H * D;
  auto run = [&](DType dtype, bool autocast, Tensor* grad) {
    Generator gen(9);  // the same values in every run
    const Tensor qkv = to(randn({B, S, 3 * C}, gen), dtype).set_requires_grad(true);
    const Tensor gy = randn({B, S, C}, gen);
    const bool layout_kept = dtype == DType::kF32 ? !autocast : true;
    const std::vector<Tensor> parts = split(qkv, C, -1);
    std::vector<Tensor> heads;
    int grads_seen = 0;
    for (const Tensor& t : parts) {
      heads.push_back(transpose(reshape(t, {B, S, H, D}), 1, 2));
      register_hook(heads.back(), [&](const Tensor& g) {
        if (layout_kept) {
          EXPECT_TRUE(transpose(g, 1, 2).is_contiguous());  // (B, S, H, D)
        }
        ++grads_seen;
        return Tensor();
      });
    }
    std::optional<AutocastGuard> guard;
    if (autocast) guard.emplace(DType::kBF16);
    SdpaOptions opts;
    opts.causal = true;
    const Tensor y = scaled_dot_product_attention(heads[0], heads[1], heads[2], opts);
    EXPECT_EQ(y.dtype(), autocast ? DType::kBF16 : dtype);
    const Tensor merged = reshape(transpose(y, 1, 2), {B, S, C});
    if (layout_kept) {
      EXPECT_EQ(merged.data_ptr(), y.data_ptr());  // a view, not a copy
    }
    guard.reset();
    backward(sum(mul(to(merged, DType::kF32), gy)));
    EXPECT_EQ(grads_seen, 3);
    EXPECT_EQ(qkv.grad().dtype(), dtype);
    *grad = qkv.grad();
    return merged;
  };
  Tensor g32, g_cast, g16;
  const Tensor y32 = run(DType::kF32, false, &g32);
  const Tensor y_cast = run(DType::kF32, true, &g_cast);
  const Tensor y16 = run(DType::kBF16, true, &g16);
  EXPECT_LT(max_diff(y_cast, y32), 2e-2);
  EXPECT_LT(max_diff(g_cast, g32), 5e-2);
  EXPECT_EQ(max_diff(y16, y_cast), 0.0);  // the cast inputs are the bf16 inputs
}

TEST(SdpaTest, BadInputsNameTheProblem) {
  Tensor q = zeros({1, 2, 4, 8}), k = zeros({1, 2, 4, 8});
  EXPECT_THROW(scaled_dot_product_attention(q, k, zeros({1, 2, 4})), InvalidArgument);
  EXPECT_THROW(scaled_dot_product_attention(q, k, zeros({1, 2, 4, 8}, DType::kBF16)),
               InvalidArgument);
  SdpaOptions opts;
  opts.window_right = -3;
  EXPECT_THROW(scaled_dot_product_attention(q, k, k, opts), InvalidArgument);
}

}  // namespace
}  // namespace tessel::kernels
