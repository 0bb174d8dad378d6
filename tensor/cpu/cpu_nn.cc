// CPU kernels for neural-network ops: softmax/log_softmax, layer_norm, rms_norm, embedding and
// cross_entropy, forward and backward. Rows run in parallel; per-column gradient sums run
// sequentially over rows (parallel over columns), so every result is deterministic.
#include <cmath>
#include <limits>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cpu/cpu_loop.h"
#include "tessel/tensor/cpu/cpu_math.h"

namespace tessel::cpu {
namespace {

// Rows per chunk so that a chunk touches about 16K elements.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

template <typename F>
void for_each_row(int64_t rows, int64_t cols, F f) {
  parallel_for(0, rows, row_grain(cols), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) f(r);
  });
}

// Calls f(column_begin, column_end) on column ranges in parallel.
template <typename F>
void for_each_column_range(int64_t cols, F f) {
  parallel_for(0, cols, 64, f);
}

// Row reductions with 16 independent lanes so the compiler vectorises them (a single running
// sum is a serial dependency it may not reorder). Lane order is fixed: results are
// deterministic.
constexpr int kLanes = 16;

template <typename F>
float lane_sum(int64_t n, F term) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += term(i + j);
  }
  float total = 0.0f;
  for (; i < n; ++i) total += term(i);
  for (float l : lanes) total += l;
  return total;
}

template <typename T>
float row_max(const T* x, int64_t n) {
  float lanes[kLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float v = convert<float>(x[i + j]);
      lanes[j] = v > lanes[j] ? v : lanes[j];
    }
  }
  float mx = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) mx = std::max(mx, convert<float>(x[i]));
  for (float l : lanes) mx = std::max(mx, l);
  return mx;
}

template <typename T>
const T* cptr(const Tensor& t) { return static_cast<const T*>(t.data_ptr()); }
template <typename T>
T* mptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }

}  // namespace

void CpuBackend::softmax(const Tensor& x, const Tensor& out, bool log) {
  dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const T* px = cptr<T>(x);
    T* po = mptr<T>(out);
    for_each_row(rows, cols, [&](int64_t r) {
      const T* xr = px + r * cols;
      T* o = po + r * cols;
      const float mx = row_max(xr, cols);
      const float sum = lane_sum(cols, [&](int64_t c) { return fast_exp(convert<float>(xr[c]) - mx); });
      if (log) {
        const float shift = mx + std::log(sum);
        for (int64_t c = 0; c < cols; ++c) o[c] = convert<T>(convert<float>(xr[c]) - shift);
      } else {
        const float inv = 1.0f / sum;
        for (int64_t c = 0; c < cols; ++c) o[c] = convert<T>(fast_exp(convert<float>(xr[c]) - mx) * inv);
      }
    });
  });
}

void CpuBackend::softmax_backward(const Tensor& grad_y, const Tensor& y, const Tensor& grad_x,
                                  bool log) {
  dispatch_floating(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = y.dim() == 0 ? 1 : y.size(-1);
    const int64_t rows = cols == 0 ? 0 : y.numel() / cols;
    const T* pg = cptr<T>(grad_y);
    const T* py = cptr<T>(y);
    T* po = mptr<T>(grad_x);
    for_each_row(rows, cols, [&](int64_t r) {
      const T* g = pg + r * cols;
      const T* yr = py + r * cols;
      T* o = po + r * cols;
      if (log) {
        const float dot = lane_sum(cols, [&](int64_t c) { return convert<float>(g[c]); });
        for (int64_t c = 0; c < cols; ++c) {
          o[c] = convert<T>(convert<float>(g[c]) - fast_exp(convert<float>(yr[c])) * dot);
        }
      } else {
        const float dot = lane_sum(cols, [&](int64_t c) { return convert<float>(g[c]) * convert<float>(yr[c]); });
        for (int64_t c = 0; c < cols; ++c) {
          o[c] = convert<T>(convert<float>(yr[c]) * (convert<float>(g[c]) - dot));
        }
      }
    });
  });
}

void CpuBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            double eps, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd) {
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
    const T* px = cptr<T>(x);
    const T* pw = weight.defined() ? cptr<T>(weight) : nullptr;
    const T* pb = bias.defined() ? cptr<T>(bias) : nullptr;
    T* po = mptr<T>(out);
    float* pm = mptr<float>(mean);
    float* ps = mptr<float>(rstd);
    for_each_row(rows, cols, [&](int64_t r) {
      const T* xr = px + r * cols;
      const float m = lane_sum(cols, [&](int64_t c) { return convert<float>(xr[c]); }) /
                      static_cast<float>(cols);
      const float var = lane_sum(cols, [&](int64_t c) {
        const float d = convert<float>(xr[c]) - m;
        return d * d;
      });
      const float s = 1.0f / std::sqrt(var / static_cast<float>(cols) + static_cast<float>(eps));
      pm[r] = m;
      ps[r] = s;
      T* o = po + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        float v = (convert<float>(xr[c]) - m) * s;
        if (pw) v *= convert<float>(pw[c]);
        if (pb) v += convert<float>(pb[c]);
        o[c] = convert<T>(v);
      }
    });
  });
}

void CpuBackend::layer_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd,
                                     const Tensor& grad_x, const Tensor& grad_weight,
                                     const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
    const T* pg = cptr<T>(grad_y);
    const T* px = cptr<T>(x);
    const T* pw = weight.defined() ? cptr<T>(weight) : nullptr;
    const float* pm = cptr<float>(mean);
    const float* ps = cptr<float>(rstd);
    if (grad_x.defined()) {
      T* po = mptr<T>(grad_x);
      for_each_row(rows, cols, [&](int64_t r) {
        const T* g = pg + r * cols;
        const T* xr = px + r * cols;
        float sum_wg = 0.0f, sum_wg_xhat = 0.0f;
        for (int64_t c = 0; c < cols; ++c) {
          const float wg = convert<float>(g[c]) * (pw ? convert<float>(pw[c]) : 1.0f);
          sum_wg += wg;
          sum_wg_xhat += wg * (convert<float>(xr[c]) - pm[r]) * ps[r];
        }
        const float inv_n = 1.0f / static_cast<float>(cols);
        for (int64_t c = 0; c < cols; ++c) {
          const float wg = convert<float>(g[c]) * (pw ? convert<float>(pw[c]) : 1.0f);
          const float xhat = (convert<float>(xr[c]) - pm[r]) * ps[r];
          po[r * cols + c] = convert<T>(ps[r] * (wg - sum_wg * inv_n - xhat * sum_wg_xhat * inv_n));
        }
      });
    }
    if (grad_weight.defined() || grad_bias.defined()) {
      float* gw = grad_weight.defined() ? mptr<float>(grad_weight) : nullptr;
      float* gb = grad_bias.defined() ? mptr<float>(grad_bias) : nullptr;
      for_each_column_range(cols, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          if (gw) gw[c] = 0.0f;
          if (gb) gb[c] = 0.0f;
        }
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = b; c < e; ++c) {
            const float g = convert<float>(pg[r * cols + c]);
            if (gw) gw[c] += g * (convert<float>(px[r * cols + c]) - pm[r]) * ps[r];
            if (gb) gb[c] += g;
          }
        }
      });
    }
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                          const Tensor& rstd) {
  dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
    const T* px = cptr<T>(x);
    const T* pw = weight.defined() ? cptr<T>(weight) : nullptr;
    T* po = mptr<T>(out);
    float* ps = mptr<float>(rstd);
    for_each_row(rows, cols, [&](int64_t r) {
      const T* xr = px + r * cols;
      const float ss = lane_sum(cols, [&](int64_t c) { return convert<float>(xr[c]) * convert<float>(xr[c]); });
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(cols) + static_cast<float>(eps));
      ps[r] = s;
      for (int64_t c = 0; c < cols; ++c) {
        po[r * cols + c] = convert<T>(convert<float>(xr[c]) * s * (pw ? convert<float>(pw[c]) : 1.0f));
      }
    });
  });
}

void CpuBackend::rms_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, const Tensor& grad_x,
                                   const Tensor& grad_weight) {
  dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
    const T* pg = cptr<T>(grad_y);
    const T* px = cptr<T>(x);
    const T* pw = weight.defined() ? cptr<T>(weight) : nullptr;
    const float* ps = cptr<float>(rstd);
    if (grad_x.defined()) {
      T* po = mptr<T>(grad_x);
      for_each_row(rows, cols, [&](int64_t r) {
        float dot = 0.0f;
        for (int64_t c = 0; c < cols; ++c) {
          const float wg = convert<float>(pg[r * cols + c]) * (pw ? convert<float>(pw[c]) : 1.0f);
          dot += wg * convert<float>(px[r * cols + c]) * ps[r];
        }
        dot /= static_cast<float>(cols);
        for (int64_t c = 0; c < cols; ++c) {
          const float wg = convert<float>(pg[r * cols + c]) * (pw ? convert<float>(pw[c]) : 1.0f);
          const float xhat = convert<float>(px[r * cols + c]) * ps[r];
          po[r * cols + c] = convert<T>(ps[r] * (wg - xhat * dot));
        }
      });
    }
    if (grad_weight.defined()) {
      float* gw = mptr<float>(grad_weight);
      for_each_column_range(cols, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) gw[c] = 0.0f;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = b; c < e; ++c) {
            gw[c] += convert<float>(pg[r * cols + c]) * convert<float>(px[r * cols + c]) * ps[r];
          }
        }
      });
    }
  });
}

void CpuBackend::embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  dispatch_all(weight.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t dim = weight.size(1);
    const int64_t* idx = indices.data<int64_t>();
    const T* pw = cptr<T>(weight);
    T* po = mptr<T>(out);
    for_each_row(indices.numel(), dim, [&](int64_t i) {
      std::copy(pw + idx[i] * dim, pw + (idx[i] + 1) * dim, po + i * dim);
    });
  });
}

void CpuBackend::embedding_backward(const Tensor& grad, const Tensor& indices,
                                    const Tensor& grad_weight) {
  dispatch_floating(grad.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t dim = grad_weight.size(1);
    const int64_t n = indices.numel();
    const int64_t* idx = indices.data<int64_t>();
    const T* pg = cptr<T>(grad);
    float* gw = mptr<float>(grad_weight);
    for_each_column_range(dim, [&](int64_t b, int64_t e) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = b; c < e; ++c) gw[idx[i] * dim + c] += convert<float>(pg[i * dim + c]);
      }
    });
  });
}

void CpuBackend::cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                               const Tensor& loss, const Tensor& lse) {
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t classes = logits.size(1);
    const T* px = cptr<T>(logits);
    const int64_t* pt = target.data<int64_t>();
    float* pl = mptr<float>(loss);
    float* ps = mptr<float>(lse);
    for_each_row(logits.size(0), classes, [&](int64_t r) {
      const T* xr = px + r * classes;
      const float mx = row_max(xr, classes);
      const float sum = lane_sum(classes, [&](int64_t c) { return fast_exp(convert<float>(xr[c]) - mx); });
      ps[r] = mx + std::log(sum);
      pl[r] = pt[r] == ignore_index ? 0.0f : ps[r] - convert<float>(xr[pt[r]]);
    });
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits,
                                        const Tensor& target, const Tensor& lse,
                                        int64_t ignore_index, const Tensor& grad_logits) {
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t classes = logits.size(1);
    const T* px = cptr<T>(logits);
    const int64_t* pt = target.data<int64_t>();
    const float* pg = cptr<float>(grad_loss);
    const float* ps = cptr<float>(lse);
    T* po = mptr<T>(grad_logits);
    for_each_row(logits.size(0), classes, [&](int64_t r) {
      T* o = po + r * classes;
      if (pt[r] == ignore_index) {
        for (int64_t c = 0; c < classes; ++c) o[c] = convert<T>(0.0f);
        return;
      }
      const T* xr = px + r * classes;
      for (int64_t c = 0; c < classes; ++c) {
        const float p = fast_exp(convert<float>(xr[c]) - ps[r]);
        o[c] = convert<T>(pg[r] * (p - (c == pt[r] ? 1.0f : 0.0f)));
      }
    });
  });
}

}  // namespace tessel::cpu
