// RoPE (kernels/llama/rope.h, nn/rope.h) against formulas written here, the fused RoPE, SwiGLU
// and RMSNorm kernels against their op-by-op references (forward and gradients, f32 and bf16).

#include "tessel/kernels/llama/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/nn/rope.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {
namespace {

using kernels::RopeScaling;

// Hugging Face's _compute_llama3_parameters as written there (both branches computed, then
// selected), in double.
std::vector<double> llama3_inv_freq(int64_t dim, double base, const RopeScaling& s) {
  std::vector<double> out;
  const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
  for (int64_t i = 0; i < dim; i += 2) {
    const double inv = 1.0 / std::pow(base, double(i) / double(dim));
    const double wavelen = 2 * std::numbers::pi / inv;
    double llama = wavelen > low_wavelen ? inv / s.factor : inv;
    const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    out.push_back(medium ? smoothed : llama);
  }
  return out;
}

TEST(RopeTest, InvFreqMatchesLlama3Scaling) {
  // Llama 3.1's own values: head 128, theta 500000, factor 8, context 8192.
  const RopeScaling llama31{8.0, 1.0, 4.0, 8192};
  const auto f = to_vector<float>(kernels::rope_inv_freq(128, 500000.0, llama31));
  const auto want = llama3_inv_freq(128, 500000.0, llama31);
  ASSERT_EQ(f.size(), 64u);
  int stretched = 0, kept = 0, between = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_NEAR(f[i], want[i], 1e-6 * want[i]) << i;
    const double plain = std::pow(500000.0, -double(2 * i) / 128.0);
    if (std::abs(want[i] - plain) < 1e-12 * plain)
      ++kept;
    else if (std::abs(want[i] - plain / 8) < 1e-12 * plain)
      ++stretched;
    else
      ++between;
  }
  // Every band is exercised (and the first frequency, wavelength 2 pi, is kept).
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(between, 0);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[63], std::pow(500000.0, -126.0 / 128.0) / 8, 1e-6 * f[63]);
  // Without scaling: theta^(-2i/d).
  const auto plain = to_vector<float>(kernels::rope_inv_freq(16, 10000.0));
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(plain[i], std::pow(10000.0, -i / 8.0), 1e-7);
  EXPECT_THROW(kernels::rope_inv_freq(7, 10000.0), InvalidArgument);
  EXPECT_THROW(kernels::rope_inv_freq(8, 10000.0, RopeScaling{8.0, 4.0, 1.0, 8192}),
               InvalidArgument);
}

TEST(RopeTest, RotationMatchesDirectFormulaAtExplicitPositions) {
  Generator gen(3);
  const int64_t B = 2, T = 5, H = 3, D = 8, half = D / 2;
  const RopeScaling scaling{4.0, 1.0, 4.0, 16};
  RotaryEmbedding rotary(D, 100.0, scaling);
  // Per-batch positions, as a shard of a longer sequence would have them.
  const std::vector<int64_t> pos = {7, 8, 9, 10, 11, 100, 101, 102, 103, 104};
  const Tensors cs = rotary(Tensors{from_vector<int64_t>(pos, {B, T})});
  ASSERT_EQ(cs[0].shape(), (Shape{B, T, half}));
  const Tensor x = randn({B, T, H, D}, gen);
  const auto y = to_vector<float>(kernels::rope(x, cs[0], cs[1]));
  const auto xv = to_vector<float>(x);
  const auto freq = llama3_inv_freq(D, 100.0, scaling);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          // (x_i + j x_{i+D/2}) * e^{j pos f_i}
          const double a = double(pos[b * T + t]) * freq[i];
          const double re = xv[base + i] * std::cos(a) - xv[base + i + half] * std::sin(a);
          const double im = xv[base + i + half] * std::cos(a) + xv[base + i] * std::sin(a);
          EXPECT_NEAR(y[base + i], re, 2e-5);
          EXPECT_NEAR(y[base + i + half], im, 2e-5);
        }
      }
    }
  }
}

TEST(RopeTest, ShardRotatedAtItsOffsetMatchesTheWholeSequence) {
  Generator gen(5);
  const int64_t T = 12, D = 16;
  RotaryEmbedding rotary(D, 10000.0);
  const Tensor x = randn({1, T, 2, D}, gen);
  const Tensors whole = rotary(Tensors{arange(T)});
  const Tensor full = kernels::rope(x, whole[0], whole[1]);
  const Tensors part = rotary(Tensors{arange(4.0, 8.0)});
  const Tensor shard = kernels::rope(narrow(x, 1, 4, 4), part[0], part[1]);
  EXPECT_EQ(to_vector<float>(shard), to_vector<float>(contiguous(narrow(full, 1, 4, 4))));
}

// max |a - b| / (max |b| + tiny)
double rel_err(const Tensor& a, const Tensor& b) {
  const auto av = to_vector<float>(to(a, DType::kF32)), bv = to_vector<float>(to(b, DType::kF32));
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < av.size(); ++i) {
    diff = std::max(diff, std::abs(double(av[i]) - bv[i]));
    scale = std::max(scale, std::abs(double(bv[i])));
  }
  return diff / scale;
}

double tolerance(DType dtype) { return dtype == DType::kF32 ? 1e-5 : 2e-2; }

TEST(RopeTest, FusedMatchesReferenceForwardAndGradient) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool batched : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (batched ? " batched" : " shared"));
      Generator gen(7);
      const int64_t B = 2, T = 6, H = 4, D = 32;
      RotaryEmbedding rotary(D, 500000.0, RopeScaling{8.0, 1.0, 4.0, 32});
      const Tensor positions = batched ? add(reshape(arange(B * T), {B, T}), 3.0) : arange(T);
      const Tensors cs = rotary(Tensors{to(positions, DType::kI64)});
      // A non-contiguous x: the (B, H, T, D) layout transposed.
      const Tensor base = to(randn({B, H, T, D}, gen), dtype);
      const Tensor g = to(randn({B, T, H, D}, gen), dtype);
      Tensor x1 = clone(base).set_requires_grad(true), x2 = clone(base).set_requires_grad(true);
      const Tensor y1 = kernels::rope(transpose(x1, 1, 2), cs[0], cs[1]);
      const Tensor y2 = kernels::rope_reference(transpose(x2, 1, 2), cs[0], cs[1]);
      EXPECT_EQ(y1.dtype(), dtype);
      EXPECT_LT(rel_err(y1, y2), tolerance(dtype));
      backward(sum(mul(y1, g)));
      backward(sum(mul(y2, g)));
      EXPECT_LT(rel_err(x1.grad(), x2.grad()), tolerance(dtype));
    }
  }
  EXPECT_THROW(kernels::rope(zeros({1, 2, 1, 4}), zeros({3, 2}), zeros({3, 2})), InvalidArgument);
}

TEST(SwigluTest, FusedMatchesReferenceForwardAndGradients) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(11);
    const Tensor g0 = to(mul(randn({3, 7, 33}, gen), 3.0), dtype);
    const Tensor u0 = to(randn({3, 7, 33}, gen), dtype);
    const Tensor dy = to(randn({3, 7, 33}, gen), dtype);
    Tensor g1 = clone(g0).set_requires_grad(true), u1 = clone(u0).set_requires_grad(true);
    Tensor g2 = clone(g0).set_requires_grad(true), u2 = clone(u0).set_requires_grad(true);
    const Tensor y1 = kernels::swiglu(g1, u1), y2 = kernels::swiglu_reference(g2, u2);
    EXPECT_LT(rel_err(y1, y2), tolerance(dtype));
    backward(sum(mul(y1, dy)));
    backward(sum(mul(y2, dy)));
    EXPECT_LT(rel_err(g1.grad(), g2.grad()), tolerance(dtype));
    EXPECT_LT(rel_err(u1.grad(), u2.grad()), tolerance(dtype));
  }
  // Values checked directly too: silu(2) * 3.
  const auto y = to_vector<float>(kernels::swiglu(full({1}, 2.0), full({1}, 3.0)));
  EXPECT_NEAR(y[0], 2.0 / (1.0 + std::exp(-2.0)) * 3.0, 1e-6);
  EXPECT_THROW(kernels::swiglu(zeros({2}), zeros({3})), InvalidArgument);
}

// The backend's fused rms_norm (what nn::RMSNorm runs) against the op-by-op formula.
TEST(RmsNormKernelTest, FusedMatchesReferenceForwardAndGradients) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Generator gen(13);
    const Tensor x0 = to(randn({4, 5, 48}, gen), dtype);
    const Tensor w0 = to(add(randn({48}, gen), 1.0), dtype);
    const Tensor dy = to(randn({4, 5, 48}, gen), dtype);
    Tensor x1 = clone(x0).set_requires_grad(true), w1 = clone(w0).set_requires_grad(true);
    Tensor x2 = clone(x0).set_requires_grad(true), w2 = clone(w0).set_requires_grad(true);
    const Tensor y1 = rms_norm(x1, w1, 1e-5);
    const Tensor x2f = to(x2, DType::kF32);
    const Tensor y2 =
        mul(to(mul(x2f, rsqrt(add(mean(mul(x2f, x2f), {-1}, true), 1e-5))), dtype), w2);
    EXPECT_LT(rel_err(y1, y2), tolerance(dtype));
    backward(sum(mul(y1, dy)));
    backward(sum(mul(y2, dy)));
    EXPECT_LT(rel_err(x1.grad(), x2.grad()), tolerance(dtype));
    EXPECT_LT(rel_err(w1.grad(), w2.grad()), tolerance(dtype));
  }
}

}  // namespace
}  // namespace tessel::nn
