// CPU layer_norm, forward and backward. Each row is normalised in f32 with a few vectorised
// loops over data that stays in L1 (16-bit rows are widened and narrowed at the ends). The
// weight and bias gradients are summed over fixed blocks of kRowBlock rows while the rows' input
// gradients are computed, and the blocks' partial sums are then added in block order: one pass
// over the inputs, and results that do not depend on the thread count.
#include <cmath>
#include <vector>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cpu/cpu_isa.h"
#include "tessel/tensor/cpu/cpu_loop.h"
#include "tessel/tensor/cpu/cpu_rows.h"
#include "tessel/tensor/cpu/cpu_vector.h"

namespace tessel::cpu {
namespace {

// Rows per block of the weight and bias gradients' partial sums.
constexpr int64_t kRowBlock = 64;

// out = (x - mean) * rstd * w + b for one row of n; returns mean and rstd. out may not be x.
TESSEL_ISA_CLONES void forward_row(const float* x, const float* w, const float* b, int64_t n,
                                   float eps, float* out, float* mean, float* rstd) {
  const float m = sum_f32(x, n) / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - m;
  const float s = 1.0f / std::sqrt(dot_f32(out, out, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] * s * w[i] + b[i];
  *mean = m;
  *rstd = s;
}

// One row of the backward pass: dx = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)) with
// xhat = (x - mean) * rstd and wg = g * w, and the row's terms of the weight and bias
// gradients added to gw (g * xhat) and gb (g). xhat and wg are scratch rows.
TESSEL_ISA_CLONES void backward_row(const float* g, const float* x, const float* w, int64_t n,
                                    float mean, float rstd, float* xhat, float* wg, float* dx,
                                    float* gw, float* gb) {
  for (int64_t i = 0; i < n; ++i) {
    xhat[i] = (x[i] - mean) * rstd;
    wg[i] = g[i] * w[i];
  }
  const float inv_n = 1.0f / static_cast<float>(n);
  const float mean_wg = sum_f32(wg, n) * inv_n;
  const float mean_wg_xhat = dot_f32(wg, xhat, n) * inv_n;
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = rstd * (wg[i] - mean_wg - xhat[i] * mean_wg_xhat);
    gw[i] += g[i] * xhat[i];
    gb[i] += g[i];
  }
}

// A per-feature parameter as f32, or `fill` repeated when undefined.
template <typename T>
std::vector<float> param_or(const Tensor& p, int64_t n, float fill) {
  std::vector<float> out(static_cast<size_t>(n), fill);
  if (!p.defined()) return out;
  const T* src = static_cast<const T*>(p.data_ptr());
  for (int64_t i = 0; i < n; ++i) out[i] = convert<float>(src[i]);
  return out;
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                            const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const std::vector<float> w = param_or<T>(weight, cols, 1.0f);
    const std::vector<float> b = param_or<T>(bias, cols, 0.0f);
    float* pm = mean.data<float>();
    float* ps = rstd.data<float>();
    for_each_row_scratch(rows, cols, 2, [&](int64_t r, float* tmp) {
      float* o = out_f32(po + r * cols, tmp + cols);
      forward_row(row_f32(px + r * cols, cols, tmp), w.data(), b.data(), cols,
                  static_cast<float>(eps), o, &pm[r], &ps[r]);
      store_row(o, po + r * cols, cols);
    });
  });
}

void CpuBackend::layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& grad_x,
                                     const Tensor& grad_weight, const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const T* pg = static_cast<const T*>(grad_y.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    T* pdx = grad_x.defined() ? static_cast<T*>(grad_x.data_ptr()) : nullptr;
    const std::vector<float> w = param_or<T>(weight, cols, 1.0f);
    const float* pm = mean.data<float>();
    const float* ps = rstd.data<float>();
    const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
    // Per block: the weight and bias gradients' partial sums over its rows.
    const bool params = grad_weight.defined() || grad_bias.defined();
    std::vector<float> partial(params ? static_cast<size_t>(blocks * 2 * cols) : 0);
    parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
      std::vector<float> buf(static_cast<size_t>(6 * cols));
      float *gbuf = buf.data(), *xbuf = gbuf + cols, *xhat = xbuf + cols, *wg = xhat + cols;
      float *dxbuf = wg + cols, *scratch = dxbuf + cols;  // scratch: partials when unwanted
      for (int64_t blk = block_begin; blk < block_end; ++blk) {
        float* gw = params ? partial.data() + blk * 2 * cols : scratch;
        float* gb = params ? gw + cols : scratch;
        std::fill(gw, gw + cols, 0.0f);
        std::fill(gb, gb + cols, 0.0f);
        for (int64_t r = blk * kRowBlock; r < std::min(rows, (blk + 1) * kRowBlock); ++r) {
          float* dx = pdx ? out_f32(pdx + r * cols, dxbuf) : dxbuf;
          backward_row(row_f32(pg + r * cols, cols, gbuf), row_f32(px + r * cols, cols, xbuf),
                       w.data(), cols, pm[r], ps[r], xhat, wg, dx, gw, gb);
          if (pdx) store_row(dx, pdx + r * cols, cols);
        }
      }
    });
    if (!params) return;
    float* gw = grad_weight.defined() ? grad_weight.data<float>() : nullptr;
    float* gb = grad_bias.defined() ? grad_bias.data<float>() : nullptr;
    parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t blk = 0; blk < blocks; ++blk) {
          sw += partial[blk * 2 * cols + c];
          sb += partial[blk * 2 * cols + cols + c];
        }
        if (gw) gw[c] = sw;
        if (gb) gb[c] = sb;
      }
    });
  });
}

}  // namespace tessel::cpu
