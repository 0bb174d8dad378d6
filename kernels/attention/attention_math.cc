#include "tessel/kernels/attention/attention_math.h"

#include <cblas.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_dropout.h"
#include "tessel/kernels/attention/attention_mask.h"
#include "tessel/kernels/attention/internal/view_rows.h"

namespace tessel::kernels::attention {
namespace {

using internal::load_row;
using internal::round_bf16;
using internal::store_row;

// C (m x n, row-major) = alpha * op(A) op(B) + beta * C.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Per-head work arrays and the steps shared by forward and backward.
template <typename Acc>
class MathHead {
 public:
  MathHead(const AttentionProblem& p, const MathOptions& o)
      : p_(p),
        mask_(p),
        drop_(p.dropout.p, p.dropout.seed, p.dropout.offset),
        round_(o.round_intermediates && p.q.dtype == DType::kBF16),
        sq_(p.q_len()),
        sk_(p.kv_len()),
        d_(p.head_dim()),
        q_(sq_ * d_),
        k_(sk_ * d_),
        v_(sk_ * d_),
        probs_(sq_ * sk_),
        dropped_(sq_ * sk_),
        lse_(sq_) {}

  void load(const AttentionView& view, int64_t b, int64_t h, std::vector<Acc>& dst) {
    for (int64_t s = 0; s < view.seq(); ++s) load_row(view, b, h, s, dst.data() + s * d_);
  }

  // probs_ = softmax(scale q k^T + mask), dropped_ = probs_ with dropout; lse_ per row.
  void probabilities(int64_t b, int64_t h) {
    const int64_t hk = h / (p_.q_heads() / p_.kv_heads());
    load(p_.q, b, h, q_);
    load(p_.k, b, hk, k_);
    load(p_.v, b, hk, v_);
    Acc* s = probs_.data();
    if (sq_ > 0 && sk_ > 0) {
      gemm(false, true, sq_, sk_, d_, static_cast<Acc>(p_.softmax_scale()), q_.data(), d_,
           k_.data(), d_, Acc(0), s, sk_);
    }
    const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
    for (int64_t i = 0; i < sq_; ++i) {
      Acc* row = s + i * sk_;
      Acc m = neg_inf;
      for (int64_t j = 0; j < sk_; ++j) {
        if (round_) row[j] = round_bf16(static_cast<float>(row[j]));
        if (!mask_.visible(b, h, i, j)) row[j] = neg_inf;
        m = std::max(m, row[j]);
      }
      Acc* drow = dropped_.data() + i * sk_;
      if (m == neg_inf) {
        for (int64_t j = 0; j < sk_; ++j) row[j] = drow[j] = 0;
        lse_[i] = neg_inf;
        continue;
      }
      Acc sum = 0;
      for (int64_t j = 0; j < sk_; ++j) sum += (row[j] = std::exp(row[j] - m));
      for (int64_t j = 0; j < sk_; ++j) {
        row[j] /= sum;
        if (round_) row[j] = round_bf16(static_cast<float>(row[j]));
        drow[j] = drop_.enabled() && !drop_.keep(b, h, i, j) ? Acc(0) : row[j] * drop_.keep_scale();
      }
      lse_[i] = m + std::log(sum);
    }
  }

  const AttentionProblem& p_;
  MaskEvaluator mask_;
  DropoutMask drop_;
  bool round_;
  int64_t sq_, sk_, d_;
  std::vector<Acc> q_, k_, v_, probs_, dropped_, lse_;
};

template <typename Acc>
void forward_impl(const AttentionProblem& p, const AttentionView& out, float* lse,
                  const MathOptions& o) {
  MathHead<Acc> w(p, o);
  std::vector<Acc> o_acc(w.sq_ * w.d_);
  for (int64_t b = 0; b < p.batch(); ++b) {
    for (int64_t h = 0; h < p.q_heads(); ++h) {
      w.probabilities(b, h);
      if (w.sq_ > 0 && w.d_ > 0) {
        if (w.sk_ > 0) {
          gemm(false, false, w.sq_, w.d_, w.sk_, Acc(1), w.dropped_.data(), w.sk_, w.v_.data(),
               w.d_, Acc(0), o_acc.data(), w.d_);
        } else {
          std::fill(o_acc.begin(), o_acc.end(), Acc(0));
        }
      }
      for (int64_t i = 0; i < w.sq_; ++i) {
        store_row(out, b, h, i, o_acc.data() + i * w.d_);
        if (lse) lse[(b * p.q_heads() + h) * w.sq_ + i] = static_cast<float>(w.lse_[i]);
      }
    }
  }
}

template <typename Acc>
void backward_impl(const AttentionProblem& p, const AttentionView& dout, const AttentionView& dq,
                   const AttentionView& dk, const AttentionView& dv, const MathOptions& o) {
  MathHead<Acc> w(p, o);
  const int64_t sq = w.sq_, sk = w.sk_, d = w.d_,
                group = p.q_heads() / std::max<int64_t>(1, p.kv_heads());
  const Acc scale = static_cast<Acc>(p.softmax_scale());
  std::vector<Acc> dout_(sq * d), dp(sq * sk), dq_acc(sq * d), dk_acc(sk * d), dv_acc(sk * d);
  const bool nonempty = sq > 0 && sk > 0 && d > 0;
  for (int64_t b = 0; b < p.batch(); ++b) {
    for (int64_t hk = 0; hk < p.kv_heads(); ++hk) {
      std::fill(dk_acc.begin(), dk_acc.end(), Acc(0));
      std::fill(dv_acc.begin(), dv_acc.end(), Acc(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        w.probabilities(b, h);
        w.load(dout, b, h, dout_);
        std::fill(dq_acc.begin(), dq_acc.end(), Acc(0));
        if (nonempty) {
          // dv += dropped^T dout; d(dropped) = dout v^T.
          gemm(true, false, sk, d, sq, Acc(1), w.dropped_.data(), sk, dout_.data(), d, Acc(1),
               dv_acc.data(), d);
          gemm(false, true, sq, sk, d, Acc(1), dout_.data(), d, w.v_.data(), d, Acc(0), dp.data(),
               sk);
          for (int64_t i = 0; i < sq; ++i) {
            Acc* dprow = dp.data() + i * sk;
            const Acc* prow = w.probs_.data() + i * sk;
            Acc rowdot = 0;
            for (int64_t j = 0; j < sk; ++j) {
              // Through dropout: d(probs) = d(dropped) * keep / (1 - p).
              if (w.drop_.enabled()) {
                dprow[j] = w.drop_.keep(b, h, i, j) ? dprow[j] * w.drop_.keep_scale() : Acc(0);
              }
              if (w.round_) dprow[j] = round_bf16(static_cast<float>(dprow[j]));
              rowdot += prow[j] * dprow[j];
            }
            // Softmax backward: ds = p * (dp - sum_j p dp).
            for (int64_t j = 0; j < sk; ++j) {
              dprow[j] = prow[j] * (dprow[j] - rowdot);
              if (w.round_) dprow[j] = round_bf16(static_cast<float>(dprow[j]));
            }
          }
          gemm(false, false, sq, d, sk, scale, dp.data(), sk, w.k_.data(), d, Acc(0), dq_acc.data(),
               d);
          gemm(true, false, sk, d, sq, scale, dp.data(), sk, w.q_.data(), d, Acc(1), dk_acc.data(),
               d);
        }
        for (int64_t i = 0; i < sq; ++i) store_row(dq, b, h, i, dq_acc.data() + i * d);
      }
      for (int64_t j = 0; j < sk; ++j) {
        store_row(dk, b, hk, j, dk_acc.data() + j * d);
        store_row(dv, b, hk, j, dv_acc.data() + j * d);
      }
    }
  }
}

}  // namespace

void math_attention_forward(const AttentionProblem& problem, const AttentionView& out, float* lse,
                            const MathOptions& options) {
  validate_attention_problem(problem);
  validate_attention_output(out, problem.q, "out");
  if (options.f64_accumulate) {
    forward_impl<double>(problem, out, lse, options);
  } else {
    forward_impl<float>(problem, out, lse, options);
  }
}

void math_attention_backward(const AttentionProblem& problem, const AttentionView& dout,
                             const AttentionView& dq, const AttentionView& dk,
                             const AttentionView& dv, const MathOptions& options) {
  validate_attention_problem(problem);
  validate_attention_output(dout, problem.q, "dout");
  validate_attention_output(dq, problem.q, "dq");
  validate_attention_output(dk, problem.k, "dk");
  validate_attention_output(dv, problem.v, "dv");
  if (options.f64_accumulate) {
    backward_impl<double>(problem, dout, dq, dk, dv, options);
  } else {
    backward_impl<float>(problem, dout, dq, dk, dv, options);
  }
}

}  // namespace tessel::kernels::attention
