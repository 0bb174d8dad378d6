// clip_grad_norm over parameters that may be shards. See clip_grad_norm.h.
#include "tessel/parallel/fsdp/clip_grad_norm.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "tessel/base/error.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel {

double grad_sum_of_squares(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  // Local sums of squares, summed per set of groups to reduce over (the sharded dimensions),
  // in the order the sets first appear (the same on every rank).
  struct Partial {
    std::vector<std::shared_ptr<ProcessGroup>> groups;
    std::vector<Tensor> sums;
  };
  std::vector<Partial> partials;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    TESSEL_CHECK(is_floating(g.dtype()), InvalidArgument,
                 "clip_grad_norm: gradient of parameter {} is not floating: {}", i, g.str());
    std::vector<std::shared_ptr<ProcessGroup>> groups;
    if (is_dtensor(params[i])) {
      const DTensor d = as_dtensor(params[i]);
      const auto names = d.mesh().dim_names();
      for (size_t m = 0; m < names.size(); ++m) {
        if (d.placements()[m].is_shard()) groups.push_back(d.mesh().group(names[m]));
      }
    }
    auto it = std::find_if(partials.begin(), partials.end(),
                           [&](const Partial& p) { return p.groups == groups; });
    if (it == partials.end()) it = partials.insert(partials.end(), Partial{groups, {}});
    const Tensor g32 = to(g, DType::kF32);
    it->sums.push_back(sum(mul(g32, g32)));
  }
  double sum_sq = 0;
  for (const Partial& p : partials) {
    Tensor total = clone(sum(stack(p.sums)));
    for (const auto& group : p.groups) group->all_reduce(total);
    sum_sq += item(total);
  }
  return sum_sq;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  TESSEL_CHECK(max_norm > 0, InvalidArgument, "clip_grad_norm: max_norm must be > 0, got {}",
               max_norm);
  const double norm = std::sqrt(grad_sum_of_squares(params));
  const double coeff = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coeff < 1.0) {
    NoGradGuard no_grad;
    for (const Tensor& p : params) {
      if (p.grad().defined()) mul_(p.grad(), coeff);
    }
  }
  return norm;
}

}  // namespace tessel
