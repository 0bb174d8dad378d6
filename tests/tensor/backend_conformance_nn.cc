// Backend conformance cases for the neural-net kernels (softmax, layer/rms norm, embedding,
// cross-entropy, each with its backward), matmul, addmm and the fused AdamW step: problems, kernel
// calls and double-precision references (see backend_conformance_test.cc for the rules).

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend_conformance.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

struct SoftmaxRow {
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  double max_abs = 0;  // of the finite values
  bool nan = false;
};
// max and sum of exp(x - max) of row r of x [rows, cols] (NaN noted as a flag, like the kernels'
// max, which skips it while exp(NaN) poisons the sum).
SoftmaxRow softmax_row(const std::vector<double>& x, int64_t r, int64_t cols) {
  SoftmaxRow row;
  for (int64_t c = 0; c < cols; ++c) {
    const double v = x[r * cols + c];
    row.nan = row.nan || std::isnan(v);
    if (v > row.max) row.max = v;
    row.max_abs = std::max(row.max_abs, mag(v));
  }
  for (int64_t c = 0; c < cols; ++c) row.sum += std::exp(x[r * cols + c] - row.max);
  if (row.nan) row.sum = std::numeric_limits<double>::quiet_NaN();
  return row;
}

// x [rows, cols] as doubles, with a common offset so layer_norm's mean matters.
Tensor norm_input(Rng& rng, const Shape& shape, DType dtype) {
  const double shift = normal_values(3)(rng);
  return contiguous_input(rng, shape, dtype,
                          [shift](Rng& r) { return shift + normal_values(1)(r); });
}
// An optional per-feature parameter [cols] (undefined half the time).
Tensor maybe_param(Rng& rng, int64_t cols, DType dtype, double center) {
  if (coin(rng, 0.5)) return Tensor();
  return contiguous_input(rng, {cols}, dtype,
                          [center](Rng& r) { return center + normal_values(0.5)(r); });
}
std::vector<double> param_or(const Tensor& t, int64_t cols, double fallback) {
  return t.defined() ? read_all(t) : std::vector<double>(cols, fallback);
}

// Mean and 1/sqrt(var + eps) (layer_norm), or 1/sqrt(mean(x^2) + eps) (rms_norm), per row.
struct NormStats {
  std::vector<double> mean, rstd;
};
NormStats norm_stats(const std::vector<double>& x, int64_t rows, int64_t cols, double eps,
                     bool rms) {
  NormStats s;
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) m += x[r * cols + c] / static_cast<double>(cols);
    if (rms) m = 0;
    for (int64_t c = 0; c < cols; ++c)
      var += (x[r * cols + c] - m) * (x[r * cols + c] - m) / static_cast<double>(cols);
    s.mean.push_back(m);
    s.rstd.push_back(1 / std::sqrt(var + eps));
  }
  return s;
}

// Targets in [0, C), or the ignore index (which may also be a real class, as PyTorch allows).
Problem cross_entropy_problem(Rng& rng, int it, bool backward) {
  const DType dtype = pick(it, kFloatDTypes);
  const int64_t n = random_shape(rng, 1, 1, true, 300)[0],
                classes = random_shape(rng, 1, 1, false, 3000)[0];
  const int64_t ignore = coin(rng, 0.5) ? -100 : uniform_int(rng, 0, classes - 1);
  std::vector<int64_t> target;
  for (int64_t i = 0; i < n; ++i)
    target.push_back(coin(rng, 0.2) ? ignore : uniform_int(rng, 0, classes - 1));
  const Tensor logits = contiguous_input(rng, {n, classes}, dtype, with_specials(normal_values(3)));
  if (!backward) {
    return Problem{{logits, index_tensor(rng, target)},
                   {output(rng, {n}, DType::kF32), output(rng, {n}, DType::kF32)},
                   {ignore}};
  }
  // lse as the forward saved it (f32).
  const std::vector<double> x = read_all(logits);
  const Tensor lse = output(rng, {n}, DType::kF32);
  for (int64_t r = 0; r < n; ++r) {
    const SoftmaxRow row = softmax_row(x, r, classes);
    write(lse, r, row.max + std::log(row.sum));
  }
  return Problem{{contiguous_input(rng, {n}, DType::kF32, normal_values(1)), logits,
                  index_tensor(rng, target), lse},
                 {output(rng, {n, classes}, dtype)},
                 {ignore}};
}

// A [batch..., rows, cols] operand: row- or column-major matrices, a leading dimension with or
// without a gap, batch dims laid out beyond them (with gaps at random).
Tensor matmul_operand(Rng& rng, const Shape& shape, DType dtype) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t rows = shape[rank - 2], cols = shape[rank - 1];
  const bool col_major = coin(rng, 0.5);
  const int64_t ld = (col_major ? rows : cols) + (coin(rng, 0.3) ? uniform_int(rng, 1, 3) : 0);
  Strides strides(rank);
  strides[rank - 2] = col_major ? 1 : ld;
  strides[rank - 1] = col_major ? ld : 1;
  int64_t running = ld * (col_major ? cols : rows);
  for (int64_t d = rank - 3; d >= 0; --d) {
    strides[d] = running * (coin(rng, 0.3) ? 2 : 1);
    running = strides[d] * shape[d];
  }
  if (shape_numel(shape) == 0) running = 0;
  const Tensor base = empty({running + 6}, dtype);
  for (int64_t i = 0; i < base.numel(); ++i) write(base, i, normal_values(1)(rng));
  return base.as_strided(shape, strides, 3);
}

// A matmul dimension: mostly small, sometimes 0, sometimes past a SIMD width.
int64_t matmul_size(Rng& rng) {
  static const int64_t kSizes[] = {0, 1, 2, 3, 5, 8, 17, 33, 70};
  return kSizes[uniform_int(rng, coin(rng, 0.9) ? 1 : 0, 8)];
}

// The output dtype of a product of `dtype` operands: theirs, or (half the time for bf16) f32,
// the accumulators written unrounded.
DType matmul_out_dtype(Rng& rng, DType dtype) {
  return dtype == DType::kBF16 && coin(rng, 0.5) ? DType::kF32 : dtype;
}

// out = a @ b (+ bias[j] on every row when defined) in double precision, NumPy batch
// broadcasting; the error scale is the sum of the terms' magnitudes (k + 4 roundings).
std::vector<Expected> matmul_reference(const Tensor& a, const Tensor& b, const Tensor& bias,
                                       const Tensor& out) {
  const int64_t rank = out.dim(), k = a.size(-1);
  // Element [batch..., i, j] of an operand, broadcasting its size-1 batch dims.
  const auto at = [rank](const Tensor& t, const std::vector<int64_t>& idx, int64_t i, int64_t j) {
    const char* ptr = static_cast<const char*>(t.data_ptr());
    for (int64_t d = 0; d < rank - 2; ++d) {
      if (t.shape()[d] != 1) {
        ptr += idx[d] * t.strides()[d] * static_cast<int64_t>(t.element_size());
      }
    }
    ptr += (i * t.strides()[rank - 2] + j * t.strides()[rank - 1]) *
           static_cast<int64_t>(t.element_size());
    return read_at(ptr, t.dtype());
  };
  Expected e;
  for (int64_t o = 0; o < out.numel(); ++o) {
    const std::vector<int64_t> idx = unravel(o, out.shape());
    const int64_t i = idx[rank - 2], j = idx[rank - 1];
    double acc = 0, scale = 0;
    if (bias.defined()) {
      acc = read_at(element_ptr(bias, j), bias.dtype());
      scale = std::fabs(acc);
    }
    for (int64_t q = 0; q < k; ++q) {
      const double term = at(a, idx, i, q) * at(b, idx, q, j);
      acc += term;
      scale += std::fabs(term);
    }
    e.value.push_back(acc);
    e.scale.push_back(scale * (static_cast<double>(k) + 4));
  }
  return {e};
}

}  // namespace

KernelCase softmax_case(bool log) {
  return {log ? "log_softmax" : "softmax",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kFloatDTypes);
            const Shape shape = random_shape(rng, 1, 3);
            return Problem{{contiguous_input(rng, shape, dtype, with_specials(normal_values(4)))},
                           {output(rng, shape, dtype)}};
          },
          [log](Backend& b, const Problem& p) { b.softmax(p.in[0], p.out[0], log); },
          [log](const Problem& p) {
            const auto [rows, cols] = rows_cols(p.in[0]);
            const std::vector<double> x = read_all(p.in[0]);
            Expected e;
            const double sum_ulps = static_cast<double>(cols) / 16 + 16;  // the lane sums
            for (int64_t r = 0; r < rows; ++r) {
              const SoftmaxRow row = softmax_row(x, r, cols);
              for (int64_t c = 0; c < cols; ++c) {
                const double d = x[r * cols + c] - row.max;
                if (log) {
                  const double lse = std::log(row.sum);
                  e.value.push_back(d - lse);
                  e.scale.push_back(4 * row.max_abs + 2 * mag(lse) + sum_ulps);
                } else {
                  const double y = std::exp(d) / row.sum;
                  e.value.push_back(y);
                  e.scale.push_back(mag(y) * (2 * row.max_abs + 8 + sum_ulps));
                }
              }
            }
            return std::vector<Expected>{e};
          },
          kEps};
}

KernelCase softmax_backward_case(bool log) {
  return {
      log ? "log_softmax_backward" : "softmax_backward",
      [log](Rng& rng, int it) {
        const DType dtype = pick(it, kFloatDTypes);
        const Shape shape = random_shape(rng, 1, 3);
        // y: a softmax (log_softmax) output of random logits, rounded to the dtype.
        const Tensor y = contiguous_input(rng, shape, dtype, normal_values(2));
        const auto [rows, cols] = rows_cols(y);
        const std::vector<double> logits = read_all(y);
        for (int64_t r = 0; r < rows; ++r) {
          const SoftmaxRow row = softmax_row(logits, r, cols);
          for (int64_t c = 0; c < cols; ++c) {
            const double d = logits[r * cols + c] - row.max;
            write(y, r * cols + c, log ? d - std::log(row.sum) : std::exp(d) / row.sum);
          }
        }
        return Problem{{contiguous_input(rng, shape, dtype, normal_values(1)), y},
                       {output(rng, shape, dtype)}};
      },
      [log](Backend& b, const Problem& p) { b.softmax_backward(p.in[0], p.in[1], p.out[0], log); },
      [log](const Problem& p) {
        const auto [rows, cols] = rows_cols(p.in[1]);
        const std::vector<double> g = read_all(p.in[0]), y = read_all(p.in[1]);
        Expected e;
        const double sum_ulps = static_cast<double>(cols) / 16 + 16;
        for (int64_t r = 0; r < rows; ++r) {
          double dot = 0, dot_abs = 0, total = 0, total_abs = 0;
          for (int64_t c = 0; c < cols; ++c) {
            dot += g[r * cols + c] * y[r * cols + c];
            dot_abs += std::fabs(g[r * cols + c] * y[r * cols + c]);
            total += g[r * cols + c];
            total_abs += std::fabs(g[r * cols + c]);
          }
          for (int64_t c = 0; c < cols; ++c) {
            const double gi = g[r * cols + c], yi = y[r * cols + c];
            if (log) {
              e.value.push_back(gi - std::exp(yi) * total);
              e.scale.push_back(std::fabs(gi) + std::exp(yi) * total_abs * sum_ulps);
            } else {
              e.value.push_back(yi * (gi - dot));
              e.scale.push_back(std::fabs(yi) * (std::fabs(gi) + dot_abs * sum_ulps) * 2);
            }
          }
        }
        return std::vector<Expected>{e};
      },
      kEps};
}

KernelCase norm_case(bool rms) {
  return {rms ? "rms_norm" : "layer_norm",
          [rms](Rng& rng, int it) {
            const DType dtype = pick(it, kFloatDTypes);
            const Shape shape = random_shape(rng, 1, 3);
            const auto [rows, cols] = rows_cols(shape);
            Problem p{{norm_input(rng, shape, dtype), maybe_param(rng, cols, dtype, 1),
                       rms ? Tensor() : maybe_param(rng, cols, dtype, 0)},
                      {output(rng, shape, dtype), output(rng, {rows}, DType::kF32),
                       output(rng, {rows}, DType::kF32)},
                      {},
                      {coin(rng, 0.5) ? 1e-5 : 1e-3}};
            if (rms) p.out.erase(p.out.begin() + 1);  // rms_norm has no mean
            return p;
          },
          [rms](Backend& b, const Problem& p) {
            if (rms) {
              b.rms_norm(p.in[0], p.in[1], p.reals[0], p.out[0], p.out[1]);
            } else {
              b.layer_norm(p.in[0], p.in[1], p.in[2], p.reals[0], p.out[0], p.out[1], p.out[2]);
            }
          },
          [rms](const Problem& p) {
            const auto [rows, cols] = rows_cols(p.in[0]);
            const std::vector<double> x = read_all(p.in[0]), w = param_or(p.in[1], cols, 1),
                                      bias = param_or(p.in[2], cols, 0);
            const NormStats s = norm_stats(x, rows, cols, p.reals[0], rms);
            const double sum_ulps = static_cast<double>(cols) / 16 + 32;
            Expected y, mean, rstd;
            for (int64_t r = 0; r < rows; ++r) {
              double abs_mean = 0;
              for (int64_t c = 0; c < cols; ++c)
                abs_mean += std::fabs(x[r * cols + c]) / static_cast<double>(cols);
              // rstd's relative error (the variance of rows whose mean was rounded), and y's:
              // x - mean loses the mean's rounding, then the error of rstd.
              const double rstd_rel = sum_ulps * (1 + abs_mean * s.rstd[r]) * 2;
              for (int64_t c = 0; c < cols; ++c) {
                const double xhat = (x[r * cols + c] - s.mean[r]) * s.rstd[r];
                y.value.push_back(xhat * w[c] + bias[c]);
                y.scale.push_back(((mag(x[r * cols + c]) + abs_mean * sum_ulps) * s.rstd[r] +
                                   mag(xhat) * rstd_rel) *
                                      mag(w[c]) * 2 +
                                  mag(bias[c]));
              }
              mean.value.push_back(s.mean[r]);
              mean.scale.push_back(abs_mean * sum_ulps);
              rstd.value.push_back(s.rstd[r]);
              rstd.scale.push_back(s.rstd[r] * rstd_rel);
            }
            if (rms) return std::vector<Expected>{y, rstd};
            return std::vector<Expected>{y, mean, rstd};
          },
          kEps};
}

KernelCase norm_backward_case(bool rms) {
  return {rms ? "rms_norm_backward" : "layer_norm_backward",
          [rms](Rng& rng, int it) {
            const DType dtype = pick(it, kFloatDTypes);
            const Shape shape = random_shape(rng, 1, 3);
            const Tensor x = norm_input(rng, shape, dtype);
            const auto [rows, cols] = rows_cols(x);
            // mean and rstd as the forward saved them (f32).
            const NormStats s = norm_stats(read_all(x), rows, cols, 1e-5, rms);
            const Tensor mean = output(rng, {rows}, DType::kF32),
                         rstd = output(rng, {rows}, DType::kF32);
            for (int64_t r = 0; r < rows; ++r) {
              write(mean, r, s.mean[r]);
              write(rstd, r, s.rstd[r]);
            }
            // grad_x, grad_weight and grad_bias are each wanted or not.
            const auto maybe_out = [&](const Shape& sh, DType dt) {
              return coin(rng, 0.25) ? Tensor() : output(rng, sh, dt);
            };
            Problem p{{contiguous_input(rng, shape, dtype, normal_values(1)), x,
                       maybe_param(rng, cols, dtype, 1), mean, rstd},
                      {maybe_out(shape, dtype), maybe_out({cols}, DType::kF32),
                       rms ? Tensor() : maybe_out({cols}, DType::kF32)}};
            if (rms) p.out.pop_back();
            return p;
          },
          [rms](Backend& b, const Problem& p) {
            if (rms) {
              b.rms_norm_backward(p.in[0], p.in[1], p.in[2], p.in[4], p.out[0], p.out[1]);
            } else {
              b.layer_norm_backward(p.in[0], p.in[1], p.in[2], p.in[3], p.in[4], p.out[0], p.out[1],
                                    p.out[2]);
            }
          },
          [rms](const Problem& p) {
            const auto [rows, cols] = rows_cols(p.in[1]);
            const std::vector<double> g = read_all(p.in[0]), x = read_all(p.in[1]),
                                      w = param_or(p.in[2], cols, 1);
            const std::vector<double> mean = read_all(p.in[3]), rstd = read_all(p.in[4]);
            const double sum_ulps = static_cast<double>(cols) / 16 + 32;
            Expected gx, gw{std::vector<double>(cols, 0), std::vector<double>(cols, 0)};
            Expected gb = gw;
            for (int64_t r = 0; r < rows; ++r) {
              // grad_x = rstd (wg - mean(wg) - xhat mean(wg xhat)) (no mean(wg) term for rms).
              const double m = rms ? 0 : mean[r];
              double mean_wg = 0, mean_wg_xhat = 0, abs_terms = 0;
              for (int64_t c = 0; c < cols; ++c) {
                const double xhat = (x[r * cols + c] - m) * rstd[r], wg = g[r * cols + c] * w[c];
                mean_wg += rms ? 0 : wg / static_cast<double>(cols);
                mean_wg_xhat += wg * xhat / static_cast<double>(cols);
                abs_terms += std::fabs(wg) * (1 + std::fabs(xhat)) / static_cast<double>(cols);
              }
              for (int64_t c = 0; c < cols; ++c) {
                const double xhat = (x[r * cols + c] - m) * rstd[r], wg = g[r * cols + c] * w[c];
                gx.value.push_back(rstd[r] * (wg - mean_wg - xhat * mean_wg_xhat));
                gx.scale.push_back(rstd[r] *
                                   (std::fabs(wg) + abs_terms * sum_ulps * (1 + std::fabs(xhat)) +
                                    std::fabs(wg) * std::fabs(x[r * cols + c]) * rstd[r] * 4));
                gw.value[c] += g[r * cols + c] * xhat;
                gw.scale[c] += std::fabs(g[r * cols + c] * xhat) * (static_cast<double>(rows) + 4) *
                               (1 + std::fabs(x[r * cols + c]) * rstd[r]);
                gb.value[c] += g[r * cols + c];
                gb.scale[c] += std::fabs(g[r * cols + c]) * (static_cast<double>(rows) + 2);
              }
            }
            if (rms) return std::vector<Expected>{gx, gw};
            return std::vector<Expected>{gx, gw, gb};
          },
          kEps};
}

// Indices are i64: the op layer converts i32 indices before calling the kernel, and the CPU
// kernel reads i64 only.
KernelCase embedding_case() {
  return {"embedding",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kAllDTypes);
            const int64_t rows = random_shape(rng, 1, 1, false, 500)[0],
                          dim = random_shape(rng, 1, 1, true, 300)[0];
            const Shape index_shape = random_shape(rng, 1, 2, true, 300);
            std::vector<int64_t> idx;
            for (int64_t i = 0; i < shape_numel(index_shape); ++i)
              idx.push_back(uniform_int(rng, 0, rows - 1));
            Shape out_shape = index_shape;
            out_shape.push_back(dim);
            const Tensor indices = index_tensor(rng, idx, index_shape);
            return Problem{{contiguous_input(rng, {rows, dim}, dtype, values_for(dtype)), indices},
                           {output(rng, out_shape, dtype)}};
          },
          [](Backend& b, const Problem& p) { b.embedding(p.in[0], p.in[1], p.out[0]); },
          [](const Problem& p) {
            const int64_t dim = p.in[0].size(1);
            Expected e;
            for (int64_t i = 0; i < p.in[1].numel(); ++i) {
              const int64_t row = static_cast<int64_t>(read(p.in[1], i));
              for (int64_t c = 0; c < dim; ++c) e.value.push_back(read(p.in[0], row * dim + c));
            }
            return std::vector<Expected>{e};
          }};
}

KernelCase embedding_backward_case() {
  return {"embedding_backward",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, kFloatDTypes);
            const int64_t rows = random_shape(rng, 1, 1, false, 500)[0],
                          dim = random_shape(rng, 1, 1, true, 300)[0];
            const int64_t n = random_shape(rng, 1, 1, true, 300)[0];
            std::vector<int64_t> idx;
            for (int64_t i = 0; i < n; ++i)
              idx.push_back(uniform_int(rng, 0, std::min<int64_t>(rows - 1, 7)));
            const Tensor grad_weight = output(rng, {rows, dim}, DType::kF32);
            for (int64_t i = 0; i < grad_weight.numel(); ++i)
              write(grad_weight, i, 0);  // zeroed by the caller
            return Problem{
                {contiguous_input(rng, {n, dim}, dtype, normal_values(1)), index_tensor(rng, idx)},
                {grad_weight}};
          },
          [](Backend& b, const Problem& p) { b.embedding_backward(p.in[0], p.in[1], p.out[0]); },
          [](const Problem& p) {
            const int64_t dim = p.out[0].size(1);
            Expected e{std::vector<double>(p.out[0].numel(), 0),
                       std::vector<double>(p.out[0].numel(), 0)};
            std::vector<double> count(p.out[0].size(0), 0);
            for (int64_t i = 0; i < p.in[1].numel(); ++i)
              count[static_cast<int64_t>(read(p.in[1], i))] += 1;
            for (int64_t i = 0; i < p.in[1].numel(); ++i) {
              const int64_t row = static_cast<int64_t>(read(p.in[1], i));
              for (int64_t c = 0; c < dim; ++c) {
                const double g = read(p.in[0], i * dim + c);
                e.value[row * dim + c] += g;
                e.scale[row * dim + c] += std::fabs(g) * (count[row] + 1);
              }
            }
            return std::vector<Expected>{e};
          },
          kEps};
}

KernelCase cross_entropy_case() {
  return {"cross_entropy", [](Rng& rng, int it) { return cross_entropy_problem(rng, it, false); },
          [](Backend& b, const Problem& p) {
            b.cross_entropy(p.in[0], p.in[1], p.ints[0], p.out[0], p.out[1]);
          },
          [](const Problem& p) {
            const auto [rows, cols] = rows_cols(p.in[0]);
            const std::vector<double> x = read_all(p.in[0]), t = read_all(p.in[1]);
            Expected loss, lse;
            for (int64_t r = 0; r < rows; ++r) {
              const SoftmaxRow row = softmax_row(x, r, cols);
              const double l = row.max + std::log(row.sum);
              const double scale = 4 * row.max_abs + static_cast<double>(cols) / 16 + 16;
              lse.value.push_back(l);
              lse.scale.push_back(scale);
              const bool ignored = static_cast<int64_t>(t[r]) == p.ints[0];
              loss.value.push_back(ignored ? 0.0 : l - x[r * cols + static_cast<int64_t>(t[r])]);
              loss.scale.push_back(ignored ? 0.0 : scale + 2 * mag(l));
            }
            return std::vector<Expected>{loss, lse};
          },
          kEps};
}

KernelCase cross_entropy_backward_case() {
  return {"cross_entropy_backward",
          [](Rng& rng, int it) { return cross_entropy_problem(rng, it, true); },
          [](Backend& b, const Problem& p) {
            b.cross_entropy_backward(p.in[0], p.in[1], p.in[2], p.in[3], p.ints[0], p.out[0]);
          },
          [](const Problem& p) {
            const auto [rows, cols] = rows_cols(p.in[1]);
            const std::vector<double> g = read_all(p.in[0]), x = read_all(p.in[1]),
                                      t = read_all(p.in[2]), lse = read_all(p.in[3]);
            Expected e;
            for (int64_t r = 0; r < rows; ++r) {
              const bool ignored = static_cast<int64_t>(t[r]) == p.ints[0];
              for (int64_t c = 0; c < cols; ++c) {
                const double prob = std::exp(x[r * cols + c] - lse[r]);
                const double onehot = c == static_cast<int64_t>(t[r]) ? 1.0 : 0.0;
                e.value.push_back(ignored ? 0.0 : g[r] * (prob - onehot));
                // exp of a difference rounded in f32.
                e.scale.push_back(
                    ignored ? 0.0
                            : mag(g[r]) * (mag(prob) * (mag(x[r * cols + c]) + mag(lse[r]) + 4) +
                                           2 * onehot));
              }
            }
            return std::vector<Expected>{e};
          },
          kEps};
}

KernelCase matmul_case() {
  return {"matmul",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, {DType::kF32, DType::kBF16});
            const int64_t m = matmul_size(rng), k = matmul_size(rng), n = matmul_size(rng);
            Shape a_shape, b_shape, out_shape;
            for (int64_t d = uniform_int(rng, 0, 2); d > 0; --d) {  // batch dims, broadcast or not
              const int64_t s = uniform_int(rng, 1, 3);
              a_shape.push_back(coin(rng, 0.3) ? 1 : s);
              b_shape.push_back(coin(rng, 0.3) ? 1 : s);
              out_shape.push_back(std::max(a_shape.back(), b_shape.back()));
              if (a_shape.back() != 1 && b_shape.back() != 1) b_shape.back() = a_shape.back();
            }
            a_shape.insert(a_shape.end(), {m, k});
            b_shape.insert(b_shape.end(), {k, n});
            out_shape.insert(out_shape.end(), {m, n});
            return Problem{
                {matmul_operand(rng, a_shape, dtype), matmul_operand(rng, b_shape, dtype)},
                {output(rng, out_shape, matmul_out_dtype(rng, dtype))}};
          },
          [](Backend& b, const Problem& p) { b.matmul(p.in[0], p.in[1], p.out[0]); },
          [](const Problem& p) { return matmul_reference(p.in[0], p.in[1], Tensor(), p.out[0]); },
          kEps};
}

// A 2-D matmul problem plus a bias of out's dtype or f32, added to every row.
KernelCase addmm_case() {
  return {"addmm",
          [](Rng& rng, int it) {
            const DType dtype = pick(it, {DType::kF32, DType::kBF16});
            const int64_t m = matmul_size(rng), k = matmul_size(rng), n = matmul_size(rng);
            const DType out_dtype = matmul_out_dtype(rng, dtype);
            const DType bias_dtype = coin(rng, 0.5) ? DType::kF32 : out_dtype;
            return Problem{{matmul_operand(rng, {m, k}, dtype), matmul_operand(rng, {k, n}, dtype),
                            contiguous_input(rng, {n}, bias_dtype, normal_values(1))},
                           {output(rng, {m, n}, out_dtype)}};
          },
          [](Backend& b, const Problem& p) { b.addmm(p.in[2], p.in[0], p.in[1], p.out[0]); },
          [](const Problem& p) { return matmul_reference(p.in[0], p.in[1], p.in[2], p.out[0]); },
          kEps};
}

KernelCase adamw_case() {
  return {
      "adamw_step",
      [](Rng& rng, int) {
        Problem p;
        for (int64_t t = uniform_int(rng, 1, 4); t > 0; --t) {
          const Shape shape = random_shape(rng, 1, 2, true, 80000);
          p.in.push_back(contiguous_input(rng, shape, DType::kF32, normal_values(1)));   // grad
          p.out.push_back(contiguous_input(rng, shape, DType::kF32, normal_values(1)));  // param
          p.out.push_back(
              contiguous_input(rng, shape, DType::kF32, normal_values(0.01)));    // exp_avg
          p.out.push_back(contiguous_input(rng, shape, DType::kF32, [](Rng& r) {  // exp_avg_sq
            return std::fabs(normal_values(0.01)(r));
          }));
        }
        const float lr = static_cast<float>(uniform_values(1e-4, 1e-2)(rng));
        const float beta2 = coin(rng, 0.5) ? 0.999f : 0.95f;
        const float wd = coin(rng, 0.5) ? 0.0f : 0.1f;
        static const int64_t kSteps[] = {1, 2, 10, 1000};
        p.ints = {kSteps[uniform_int(rng, 0, 3)]};
        p.reals = {lr, 0.9f, beta2, 1e-8f, wd};
        return p;
      },
      [](Backend& b, const Problem& p) {
        std::vector<AdamWTensors> tensors;
        for (size_t t = 0; t < p.in.size(); ++t) {
          tensors.push_back({p.out[3 * t], p.in[t], p.out[3 * t + 1], p.out[3 * t + 2]});
        }
        const AdamWHyper hyper{static_cast<float>(p.reals[0]), static_cast<float>(p.reals[1]),
                               static_cast<float>(p.reals[2]), static_cast<float>(p.reals[3]),
                               static_cast<float>(p.reals[4]), p.ints[0]};
        b.adamw_step(tensors, hyper);
      },
      [](const Problem& p) {
        const double lr = p.reals[0], b1 = p.reals[1], b2 = p.reals[2], eps = p.reals[3],
                     wd = p.reals[4];
        const double step = static_cast<double>(p.ints[0]);
        const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
        std::vector<Expected> want;
        for (size_t t = 0; t < p.in.size(); ++t) {
          Expected param, m, v;
          for (int64_t i = 0; i < p.in[t].numel(); ++i) {
            const double g = read(p.in[t], i), p0 = read(p.out[3 * t], i);
            const double m0 = read(p.out[3 * t + 1], i), v0 = read(p.out[3 * t + 2], i);
            const double m1 = b1 * m0 + (1 - b1) * g, v1 = b2 * v0 + (1 - b2) * g * g;
            const double update = lr / bc1 * m1 / (std::sqrt(v1) / std::sqrt(bc2) + eps);
            param.value.push_back(p0 * (1 - lr * wd) - update);
            param.scale.push_back(4 * std::fabs(p0) + 16 * std::fabs(update));
            m.value.push_back(m1);
            m.scale.push_back(4 * (std::fabs(b1 * m0) + std::fabs((1 - b1) * g)));
            v.value.push_back(v1);
            v.scale.push_back(4 * (b2 * v0 + (1 - b2) * g * g));
          }
          want.insert(want.end(), {param, m, v});
        }
        return want;
      },
      kEps};
}

}  // namespace tessel::testing
