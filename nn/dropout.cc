#include "tessel/nn/dropout.h"

#include "tessel/base/error.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn {

Dropout::Dropout(double p, Generator* gen) : Module("Dropout"), p_(p), gen_(gen) {
  TESSEL_CHECK(p >= 0 && p < 1, InvalidArgument, "Dropout probability must be in [0, 1), got {}",
               p);
}

Tensor Dropout::forward(const Tensor& x) {
  if (p_ == 0 || !is_training()) return x;
  return dropout(x, p_, true, gen_);
}

}  // namespace tessel::nn
