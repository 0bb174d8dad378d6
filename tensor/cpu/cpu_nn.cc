// CPU kernels for neural-network ops: softmax/log_softmax, rms_norm, embedding and
// cross_entropy, forward and backward (layer_norm: cpu_layer_norm.cc). Rows run in parallel;
// per-column gradient sums run sequentially over rows (parallel over columns), so every result
// is deterministic.
#include <cmath>
#include <limits>

#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/cpu/cpu_loop.h"
#include "tessel/tensor/cpu/cpu_math.h"
#include "tessel/tensor/cpu/cpu_rows.h"
#include "tessel/tensor/cpu/cpu_vector.h"

namespace tessel::cpu {
namespace {

// A per-feature parameter as f32 (empty when undefined).
template <typename T>
std::vector<float> param_f32(const Tensor& p) {
  std::vector<float> out;
  if (!p.defined()) return out;
  const T* src = static_cast<const T*>(p.data_ptr());
  for (int64_t i = 0; i < p.numel(); ++i) out.push_back(convert<float>(src[i]));
  return out;
}

// Per-row backward setup of rms_norm (5 scratch rows): the gradient and
// input as f32, wg = gradient * weight (the gradient itself without a weight), a buffer for
// xhat and the row to write grad_x into.
struct NormGradRow {
  const float* g;
  const float* x;
  float* xhat;
  float* wg;
  float* out;
};
template <typename T>
NormGradRow norm_grad_row(const T* g, const T* x, T* out, const std::vector<float>& wf,
                          int64_t cols, float* tmp) {
  NormGradRow row{row_f32(g, cols, tmp), row_f32(x, cols, tmp + cols), tmp + 2 * cols,
                  tmp + 3 * cols, out_f32(out, tmp + 4 * cols)};
  if (wf.empty()) {
    std::copy(row.g, row.g + cols, row.wg);
  } else {
    binary_f32(BinaryOp::kMul, row.g, wf.data(), 1, row.wg, cols);
  }
  return row;
}

// Calls f(column_begin, column_end) on column ranges in parallel.
template <typename F>
void for_each_column_range(int64_t cols, F f) {
  parallel_for(0, cols, 64, f);
}

template <typename T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <typename T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

void CpuBackend::softmax(const Tensor& x, const Tensor& out, bool log) {
  dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const T* px = cptr<T>(x);
    T* po = mptr<T>(out);
    for_each_row_scratch(rows, cols, 1, [&](int64_t r, float* tmp) {
      const float* xr = row_f32(px + r * cols, cols, tmp);
      float* o = out_f32(po + r * cols, tmp);
      // max_f32 skips NaN, but exp(NaN - mx) makes the sum NaN and so the whole row (as in
      // PyTorch); so does +inf (inf - inf) and an all -inf row.
      const float mx = max_f32(xr, cols);
      const float sum = sum_exp_f32(xr, mx, cols);
      if (log) {
        const float shift = mx + std::log(sum);
        binary_f32(BinaryOp::kSub, xr, &shift, 0, o, cols);
      } else {
        const float inv = 1.0f / sum;
        binary_f32(BinaryOp::kSub, xr, &mx, 0, o, cols);
        unary_f32(UnaryOp::kExp, o, o, cols);
        binary_f32(BinaryOp::kMul, o, &inv, 0, o, cols);
      }
      store_row(o, po + r * cols, cols);
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
    for_each_row_scratch(rows, cols, 3, [&](int64_t r, float* tmp) {
      const float* g = row_f32(pg + r * cols, cols, tmp);
      const float* yr = row_f32(py + r * cols, cols, tmp + cols);
      float* o = out_f32(po + r * cols, tmp + 2 * cols);
      if (log) {
        // grad_x = g - exp(y) * sum(g)
        const float total = sum_f32(g, cols);
        unary_f32(UnaryOp::kExp, yr, o, cols);
        binary_f32(BinaryOp::kMul, o, &total, 0, o, cols);
        binary_f32(BinaryOp::kSub, g, o, 1, o, cols);
      } else {
        // grad_x = y * (g - <g, y>)
        const float dot = dot_f32(g, yr, cols);
        binary_f32(BinaryOp::kSub, g, &dot, 0, o, cols);
        binary_f32(BinaryOp::kMul, o, yr, 1, o, cols);
      }
      store_row(o, po + r * cols, cols);
    });
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                          const Tensor& rstd) {
  dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
    const T* px = cptr<T>(x);
    const std::vector<float> wf = param_f32<T>(weight);
    T* po = mptr<T>(out);
    float* ps = mptr<float>(rstd);
    for_each_row_scratch(rows, cols, 2, [&](int64_t r, float* tmp) {
      const float* xr = row_f32(px + r * cols, cols, tmp);
      float* o = out_f32(po + r * cols, tmp + cols);
      const float ss = dot_f32(xr, xr, cols);
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(cols) + static_cast<float>(eps));
      ps[r] = s;
      binary_f32(BinaryOp::kMul, xr, &s, 0, o, cols);
      if (!wf.empty()) binary_f32(BinaryOp::kMul, o, wf.data(), 1, o, cols);
      store_row(o, po + r * cols, cols);
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
    const float* ps = cptr<float>(rstd);
    if (grad_x.defined()) {
      T* po = mptr<T>(grad_x);
      const std::vector<float> wf = param_f32<T>(weight);
      for_each_row_scratch(rows, cols, 5, [&](int64_t r, float* tmp) {
        // grad_x = rstd * (wg - xhat * mean(wg * xhat)), xhat = x * rstd, wg = grad * weight.
        const NormGradRow row =
            norm_grad_row(pg + r * cols, px + r * cols, po + r * cols, wf, cols, tmp);
        float* xhat = row.xhat;
        const float* wg = row.wg;
        float* o = row.out;
        binary_f32(BinaryOp::kMul, row.x, &ps[r], 0, xhat, cols);
        const float dot = dot_f32(wg, xhat, cols) / static_cast<float>(cols);
        binary_f32(BinaryOp::kMul, xhat, &dot, 0, xhat, cols);
        binary_f32(BinaryOp::kSub, wg, xhat, 1, o, cols);
        binary_f32(BinaryOp::kMul, o, &ps[r], 0, o, cols);
        store_row(o, po + r * cols, cols);
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

namespace {

// Every index in [0, limit) or equal to `allowed`; throws OutOfRange naming the first that is not.
void check_indices(const char* op, const Tensor& indices, int64_t limit, int64_t allowed) {
  const int64_t* p = indices.data<int64_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    TESSEL_CHECK((p[i] >= 0 && p[i] < limit) || p[i] == allowed, OutOfRange,
                 "{}: index {} at position {} is out of range [0, {})", op, p[i], i, limit);
  }
}

}  // namespace

void CpuBackend::embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  check_indices("embedding", indices, weight.size(0), INT64_MIN);  // no value is exempt
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
  check_indices("cross_entropy target", target, logits.size(1), ignore_index);
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t classes = logits.size(1);
    const T* px = cptr<T>(logits);
    const int64_t* pt = target.data<int64_t>();
    float* pl = mptr<float>(loss);
    float* ps = mptr<float>(lse);
    for_each_row_scratch(logits.size(0), classes, 1, [&](int64_t r, float* tmp) {
      const float* xr = row_f32(px + r * classes, classes, tmp);
      const float mx = max_f32(xr, classes);
      ps[r] = mx + std::log(sum_exp_f32(xr, mx, classes));
      pl[r] = pt[r] == ignore_index ? 0.0f : ps[r] - xr[pt[r]];
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
    for_each_row_scratch(logits.size(0), classes, 2, [&](int64_t r, float* tmp) {
      float* o = out_f32(po + r * classes, tmp + classes);
      if (pt[r] == ignore_index) {
        std::fill(o, o + classes, 0.0f);
      } else {
        // grad = g * (softmax - one_hot(target))
        const float* xr = row_f32(px + r * classes, classes, tmp);
        binary_f32(BinaryOp::kSub, xr, &ps[r], 0, o, classes);
        unary_f32(UnaryOp::kExp, o, o, classes);
        binary_f32(BinaryOp::kMul, o, &pg[r], 0, o, classes);
        o[pt[r]] -= pg[r];
      }
      store_row(o, po + r * classes, classes);
    });
  });
}

}  // namespace tessel::cpu
