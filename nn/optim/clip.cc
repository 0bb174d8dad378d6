#include "tessel/nn/optim/clip.h"

#include <cmath>

#include "tessel/base/error.h"

namespace tessel::nn::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  TESSEL_CHECK(max_norm > 0, InvalidArgument, "clip_grad_norm: max_norm must be > 0, got {}",
               max_norm);
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    TESSEL_CHECK(g.dtype() == DType::kF32 && g.is_contiguous() && g.device().is_cpu(),
                 InvalidArgument,
                 "clip_grad_norm: gradient of parameter {} must be a contiguous f32 CPU tensor, "
                 "got {}",
                 i, g.str());
    grads.push_back(g);
  }
  double sum_sq = 0;
  for (const Tensor& g : grads) {
    const float* p = g.data<float>();
    double partial = 0;
    for (int64_t k = 0; k < g.numel(); ++k) partial += static_cast<double>(p[k]) * p[k];
    sum_sq += partial;
  }
  const double norm = std::sqrt(sum_sq);
  const double coeff = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coeff < 1.0) {
    const float c = static_cast<float>(coeff);
    for (const Tensor& g : grads) {
      float* p = g.data<float>();
      for (int64_t k = 0; k < g.numel(); ++k) p[k] *= c;
    }
  }
  return norm;
}

}  // namespace tessel::nn::optim
