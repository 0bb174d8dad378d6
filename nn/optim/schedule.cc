#include "tessel/nn/optim/schedule.h"

#include <cmath>
#include <numbers>

#include "tessel/base/error.h"

namespace tessel::nn::optim {

WarmupCosine::WarmupCosine(const WarmupCosineOptions& options) : options_(options) {
  TESSEL_CHECK(options.min_lr >= 0 && options.min_lr <= options.max_lr, InvalidArgument,
               "warmup-cosine needs 0 <= min_lr <= max_lr, got min_lr {} max_lr {}", options.min_lr,
               options.max_lr);
  TESSEL_CHECK(options.warmup_steps >= 0 && options.warmup_steps <= options.total_steps,
               InvalidArgument,
               "warmup-cosine needs 0 <= warmup_steps <= total_steps, got {} and {}",
               options.warmup_steps, options.total_steps);
}

double WarmupCosine::lr(int64_t step) const {
  TESSEL_CHECK(step >= 0, InvalidArgument, "learning-rate step must be >= 0, got {}", step);
  const auto& o = options_;
  if (step < o.warmup_steps) {
    return o.max_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  if (step >= o.total_steps) return o.min_lr;
  const double progress = static_cast<double>(step - o.warmup_steps) /
                          static_cast<double>(o.total_steps - o.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return o.min_lr + coeff * (o.max_lr - o.min_lr);
}

}  // namespace tessel::nn::optim
