#pragma once
// Learning-rate schedules. A schedule is a pure function of the step; apply it each step:
//
//   WarmupCosine schedule({.max_lr = 6e-4, .min_lr = 6e-5, .warmup_steps = 100,
//                          .total_steps = 5000});
//   for (int64_t step = 0; step < 5000; ++step) { opt.set_lr(schedule.lr(step)); ... }

#include <cstdint>

namespace tessel::nn::optim {

struct WarmupCosineOptions {
  double max_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;  // the step at which the decay reaches min_lr
};

// Linear warmup from max_lr / warmup_steps (step 0) to max_lr (step warmup_steps - 1), then
// half a cosine from max_lr (step warmup_steps) down to min_lr (step total_steps), then min_lr.
// Thread-safe (immutable).
class WarmupCosine {
 public:
  // Throws InvalidArgument unless 0 <= min_lr <= max_lr and 0 <= warmup_steps <= total_steps.
  explicit WarmupCosine(const WarmupCosineOptions& options);
  // The learning rate for `step` (0-based). Throws InvalidArgument for a negative step.
  double lr(int64_t step) const;

 private:
  WarmupCosineOptions options_;
};

}  // namespace tessel::nn::optim
