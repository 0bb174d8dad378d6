#include "tessel/nn/linear.h"

#include <cmath>

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

Tensor uniform_init(const Shape& shape, double bound, Generator* gen) {
  Tensor u = gen ? rand(shape, *gen) : rand(shape);
  return sub(mul(u, 2.0 * bound), bound);
}

Tensor normal_init(const Shape& shape, double std, Generator* gen) {
  return mul(gen ? randn(shape, *gen) : randn(shape), std);
}

Linear::Linear(const LinearOptions& options, Generator* gen) : Module("Linear") {
  TESSEL_CHECK(options.in_features > 0 && options.out_features > 0, InvalidArgument,
               "Linear needs positive sizes, got in_features {} out_features {}",
               options.in_features, options.out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features));
  weight_ = &register_parameter(
      "weight", uniform_init({options.out_features, options.in_features}, bound, gen));
  if (options.bias) {
    bias_ = &register_parameter("bias", uniform_init({options.out_features}, bound, gen));
  }
}

Tensor Linear::forward(const Tensor& x) { return linear(x, *weight_, bias()); }

}  // namespace tessel::nn
