#pragma once
// The fused multi-tensor AdamW step: one pass over every parameter, reading each element's
// parameter, gradient and two moments once and writing three of them once (PyTorch's
// `fused=True` AdamW on the CPU). The work is cut into equal chunks across all tensors and the
// chunks are shared among threads, so many small tensors cost as little as one large one.
//
// Thread-safety: the call is reentrant; the slices must not overlap each other.

#include <cstdint>
#include <span>

namespace tessel::kernels {

// One tensor's contiguous f32 arrays, `count` elements each.
struct AdamWSlice {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;     // first moment, updated in place
  float* exp_avg_sq = nullptr;  // second moment, updated in place
  int64_t count = 0;
};

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: p *= 1 - lr * weight_decay
  int64_t step = 1;           // 1 for the first update (bias correction)
};

// Applies one AdamW update to every slice, with PyTorch's arithmetic:
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// on the tensor thread pool (tensor/thread_pool.h; small totals run on the caller's thread).
// Blocking; returns when every element is updated. Results do not depend on the thread count.
void fused_adamw_step(std::span<const AdamWSlice> slices, const AdamWHyper& hyper);

}  // namespace tessel::kernels
