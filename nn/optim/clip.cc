#include "tessel/nn/optim/clip.h"

#include <algorithm>
#include <cmath>

#include "tessel/base/error.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::nn::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  TESSEL_CHECK(max_norm > 0, InvalidArgument, "clip_grad_norm: max_norm must be > 0, got {}",
               max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  // Per device, each gradient's sum of squares; the host reads one total per device.
  std::vector<std::pair<Device, std::vector<Tensor>>> partials;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    TESSEL_CHECK(is_floating(g.dtype()), InvalidArgument,
                 "clip_grad_norm: gradient of parameter {} is not floating: {}", i, g.str());
    const Tensor g32 = to(g, DType::kF32);
    auto it = std::find_if(partials.begin(), partials.end(),
                           [&](const auto& p) { return p.first == g.device(); });
    if (it == partials.end()) it = partials.insert(partials.end(), {g.device(), {}});
    it->second.push_back(sum(mul(g32, g32)));
    grads.push_back(g);
  }
  double sum_sq = 0;
  for (const auto& [device, sums] : partials) sum_sq += item(sum(stack(sums)));
  const double norm = std::sqrt(sum_sq);
  const double coeff = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coeff < 1.0) {
    for (const Tensor& g : grads) mul_(g, coeff);
  }
  return norm;
}

}  // namespace tessel::nn::optim
