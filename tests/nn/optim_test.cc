// Optimizers, schedule and clipping against independent double-precision loops written here.

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/nn/optim/clip.h"
#include "tessel/nn/optim/schedule.h"
#include "tessel/nn/optim/sgd.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::nn::optim {
namespace {

using Values = std::vector<double>;

Tensor random_tensor(int64_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<float> dist(0.0f, static_cast<float>(scale));
  Tensor t = empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = dist(rng);
  return t;
}

Values values_of(const Tensor& t) {
  Values out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.data<float>()[i];
  return out;
}

void expect_close(const Tensor& actual, const Values& expected, double tol, const char* what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_NEAR(actual.data<float>()[i], expected[i], tol * (1 + std::abs(expected[i])))
        << what << " element " << i;
  }
}

// Element counts 0, 1, odd and large (the large one crosses the fused kernel's chunk and
// threading thresholds).
const std::vector<int64_t> kSizes = {0, 1, 7, 1000, 300001};

struct Problem {
  std::vector<Tensor> params;
  std::vector<Values> reference;  // the same starting values, in double
  std::mt19937 rng{42};

  Problem() {
    for (int64_t n : kSizes) {
      params.push_back(random_tensor(n, rng).set_requires_grad(true));
      reference.push_back(values_of(params.back()));
    }
  }
  // Fresh random gradients on every parameter but `skip`; returns them in double.
  std::vector<Values> new_grads(size_t skip = SIZE_MAX) {
    std::vector<Values> grads(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == skip) {
        params[i].set_grad(Tensor());
        continue;
      }
      Tensor g = random_tensor(params[i].numel(), rng, 0.5);
      grads[i] = values_of(g);
      params[i].set_grad(g);
    }
    return grads;
  }
};

struct SgdCase {
  SgdOptions options;
  const char* name;
};

class SgdTest : public testing::TestWithParam<SgdCase> {};

TEST_P(SgdTest, MatchesReferenceLoop) {
  const SgdOptions o = GetParam().options;
  Problem problem;
  Sgd sgd(problem.params, o);
  std::vector<Values> buf(problem.params.size());
  for (int step = 0; step < 4; ++step) {
    const size_t skip = step == 2 ? 1 : SIZE_MAX;  // one parameter misses a step
    const std::vector<Values> grads = problem.new_grads(skip);
    sgd.step();
    for (size_t i = 0; i < problem.params.size(); ++i) {
      if (i == skip) continue;
      Values& p = problem.reference[i];
      for (size_t k = 0; k < p.size(); ++k) {
        double d = grads[i][k] + o.weight_decay * p[k];
        if (o.momentum != 0) {
          if (buf[i].empty()) buf[i].assign(p.size(), 0.0);
          const bool first = step == 0 || (i == 1 && step == 0);
          buf[i][k] = first ? d : o.momentum * buf[i][k] + (1 - o.dampening) * d;
          d = o.nesterov ? d + o.momentum * buf[i][k] : buf[i][k];
        }
        p[k] -= o.lr * d;
      }
    }
  }
  for (size_t i = 0; i < problem.params.size(); ++i) {
    expect_close(problem.params[i], problem.reference[i], 1e-5, GetParam().name);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, SgdTest,
    testing::Values(SgdCase{{.lr = 0.1}, "plain"},
                    SgdCase{{.lr = 0.05, .momentum = 0.9}, "momentum"},
                    SgdCase{{.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.01},
                            "dampening_decay"},
                    SgdCase{{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true},
                            "nesterov"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SgdTest, RejectsBadOptions) {
  EXPECT_THROW(Sgd({}, {.lr = 0.1, .nesterov = true}), InvalidArgument);
  EXPECT_THROW(Sgd({}, {.lr = -1}), InvalidArgument);
  EXPECT_THROW(Sgd({zeros({2}, DType::kI64)}, {}), InvalidArgument);
}

class AdamWTest : public testing::TestWithParam<int> {};  // thread count

TEST_P(AdamWTest, FusedStepMatchesPerParameterReference) {
  const AdamWOptions o{.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  const int previous_threads = num_threads();
  set_num_threads(GetParam());
  Problem problem;
  AdamW adamw(problem.params, o);
  std::vector<Values> m(problem.params.size()), v(problem.params.size());
  std::vector<int> steps(problem.params.size(), 0);
  for (size_t i = 0; i < m.size(); ++i) {
    m[i].assign(problem.reference[i].size(), 0.0);
    v[i].assign(problem.reference[i].size(), 0.0);
  }
  for (int step = 1; step <= 5; ++step) {
    const size_t skip = step == 3 ? 2 : SIZE_MAX;
    const std::vector<Values> grads = problem.new_grads(skip);
    adamw.step();
    for (size_t i = 0; i < problem.params.size(); ++i) {
      if (i == skip) continue;
      // PyTorch's fused AdamW counts steps per optimizer call, as here.
      const double bc1 = 1 - std::pow(o.beta1, step);
      const double bc2 = 1 - std::pow(o.beta2, step);
      Values& p = problem.reference[i];
      for (size_t k = 0; k < p.size(); ++k) {
        const double g = grads[i][k];
        p[k] *= 1 - o.lr * o.weight_decay;
        m[i][k] = o.beta1 * m[i][k] + (1 - o.beta1) * g;
        v[i][k] = o.beta2 * v[i][k] + (1 - o.beta2) * g * g;
        p[k] -= o.lr / bc1 * m[i][k] / (std::sqrt(v[i][k]) / std::sqrt(bc2) + o.eps);
      }
    }
  }
  for (size_t i = 0; i < problem.params.size(); ++i) {
    expect_close(problem.params[i], problem.reference[i], 2e-5, "param");
    expect_close(adamw.exp_avg(i), m[i], 2e-5, "exp_avg");
    expect_close(adamw.exp_avg_sq(i), v[i], 2e-5, "exp_avg_sq");
  }
  EXPECT_EQ(adamw.step_count(), 5);
  set_num_threads(previous_threads);
}

INSTANTIATE_TEST_SUITE_P(Threads, AdamWTest, testing::Values(1, 2, 3, 0));

TEST(AdamWTest, RejectsMismatchedGradients) {
  Tensor p = zeros({4});
  p.set_requires_grad(true);
  AdamW adamw({p}, {});
  p.ensure_autograd_meta().grad = zeros({5});  // bypasses set_grad's own check
  EXPECT_THROW(adamw.step(), InvalidArgument);
  EXPECT_THROW(AdamW({p}, {.beta1 = 1.0}), InvalidArgument);
}

TEST(WarmupCosineTest, MatchesTheFormula) {
  const WarmupCosineOptions o{.max_lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
  WarmupCosine schedule(o);
  EXPECT_DOUBLE_EQ(schedule.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(schedule.lr(4), 0.5);
  EXPECT_DOUBLE_EQ(schedule.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(schedule.lr(10), 1.0);
  EXPECT_NEAR(schedule.lr(60), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(schedule.lr(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_DOUBLE_EQ(schedule.lr(110), 0.1);
  EXPECT_DOUBLE_EQ(schedule.lr(1000), 0.1);
  for (int64_t s = 10; s < 110; ++s) EXPECT_GE(schedule.lr(s), schedule.lr(s + 1));
  EXPECT_THROW(schedule.lr(-1), InvalidArgument);
  EXPECT_THROW(WarmupCosine({.max_lr = 1, .min_lr = 2}), InvalidArgument);
  EXPECT_THROW(WarmupCosine({.warmup_steps = 5, .total_steps = 4}), InvalidArgument);
  // No warmup starts at max_lr.
  EXPECT_DOUBLE_EQ(WarmupCosine({.max_lr = 2, .warmup_steps = 0, .total_steps = 5}).lr(0), 2.0);
}

TEST(ClipGradNormTest, ReturnsTheGlobalNormAndScalesAboveTheLimit) {
  for (double max_norm : {1e9, 3.0, 0.5}) {
    Problem problem;
    const std::vector<Values> grads = problem.new_grads(/*skip=*/1);
    double sum_sq = 0;
    for (const Values& g : grads) {
      for (double x : g) sum_sq += x * x;
    }
    const double norm = std::sqrt(sum_sq);
    // Sums of squares accumulate in f32 on the gradients' device, as PyTorch's do.
    EXPECT_NEAR(clip_grad_norm(problem.params, max_norm), norm, 1e-6 * norm);
    const double coeff = std::min(1.0, max_norm / (norm + 1e-6));
    for (size_t i = 0; i < grads.size(); ++i) {
      if (i == 1) {
        EXPECT_FALSE(problem.params[i].grad().defined());
        continue;
      }
      Values scaled = grads[i];
      for (double& x : scaled) x *= coeff;
      expect_close(problem.params[i].grad(), scaled, 1e-6, "grad");
    }
  }
  EXPECT_THROW(clip_grad_norm({}, 0.0), InvalidArgument);
  EXPECT_EQ(clip_grad_norm({}, 1.0), 0.0);
}

}  // namespace
}  // namespace tessel::nn::optim
