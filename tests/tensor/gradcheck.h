#pragma once
// Finite-difference gradient checking for tests: compares backward()'s gradients of
// sum(f(inputs) * R) (R a fixed random tensor, so every output element matters differently)
// against central differences computed independently of autograd.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// inputs: f32 leaves (made to require gradients here). eps: step; tol: absolute + relative.
inline void expect_gradients_match(const OpFn& f, std::vector<Tensor> inputs, double eps = 1e-2,
                                   double tol = 1e-2) {
  for (Tensor& t : inputs) t = clone(detach(t)).set_requires_grad(true);  // fresh leaves
  Generator gen(1234);
  Tensor out = f(inputs);
  const Tensor weights = randn(out.shape(), gen, DType::kF32);
  backward(sum(mul(to(out, DType::kF32), weights)));
  NoGradGuard no_grad;
  auto loss = [&]() {
    const std::vector<float> o = to_vector<float>(f(inputs));
    const std::vector<float> w = to_vector<float>(weights);
    double total = 0.0;
    for (size_t i = 0; i < o.size(); ++i) total += static_cast<double>(o[i]) * w[i];
    return total;
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    ASSERT_TRUE(x.grad().defined()) << "input " << k << " received no gradient";
    const std::vector<float> analytic = to_vector<float>(x.grad());
    float* data = x.data<float>();
    ASSERT_TRUE(x.is_contiguous());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = data[i];
      data[i] = saved + static_cast<float>(eps);
      const double plus = loss();
      data[i] = saved - static_cast<float>(eps);
      const double minus = loss();
      data[i] = saved;
      const double numeric = (plus - minus) / (2.0 * eps);
      EXPECT_NEAR(analytic[i], numeric, tol * (1.0 + std::fabs(numeric)))
          << "input " << k << " element " << i;
    }
  }
}

}  // namespace tessel::testing
