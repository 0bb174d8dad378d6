// CPU optimizer kernels: the fused multi-tensor AdamW step (PyTorch's `fused=True` AdamW on
// the CPU). One pass over every parameter reads each element's parameter, gradient and two
// moments once and writes three of them once. The work is cut into equal chunks across all
// tensors and the chunks are shared among threads, so many small tensors cost as little as one
// large one.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/tensor/cpu/cpu_backend.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel::cpu {
namespace {

// Elements per unit of work: large enough to amortise scheduling, small enough to balance.
constexpr int64_t kChunk = 1 << 16;
// Below this many elements in total, threads cost more than they save.
constexpr int64_t kMinParallelElements = 1 << 18;

struct AdamWChunk {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t count;
};

// The inner loop: restrict-qualified flat arrays so the compiler vectorises it.
void adamw_update(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, int64_t n, float decay, float beta1, float beta2,
                  float step_size, float inv_sqrt_bc2, float eps) {
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + one_minus_beta1 * gi;
    const float vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void CpuBackend::adamw_step(std::span<const AdamWTensors> tensors, const AdamWHyper& hyper) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), hyper.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), hyper.step);
  const float decay = 1.0f - hyper.lr * hyper.weight_decay;
  const float step_size = static_cast<float>(hyper.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));

  std::vector<AdamWChunk> chunks;
  int64_t total = 0;
  for (const AdamWTensors& t : tensors) {
    float* p = t.param.data<float>();
    const float* g = t.grad.data<float>();
    float* m = t.exp_avg.data<float>();
    float* v = t.exp_avg_sq.data<float>();
    const int64_t n = t.param.numel();
    for (int64_t b = 0; b < n; b += kChunk) {
      chunks.push_back({p + b, g + b, m + b, v + b, std::min(kChunk, n - b)});
    }
    total += n;
  }
  auto run = [&](const AdamWChunk& c) {
    adamw_update(c.p, c.g, c.m, c.v, c.count, decay, hyper.beta1, hyper.beta2, step_size,
                 inv_sqrt_bc2, hyper.eps);
  };
  if (total < kMinParallelElements) {
    for (const AdamWChunk& c : chunks) run(c);
    return;
  }
  // Each element is updated independently, so the split among threads cannot change results.
  parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) run(chunks[i]);
  });
}

}  // namespace tessel::cpu
