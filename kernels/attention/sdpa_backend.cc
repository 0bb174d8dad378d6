#include "tessel/kernels/attention/sdpa_backend.h"

#include <algorithm>
#include <mutex>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"
#include "tessel/kernels/attention/cuda/flash_cuda.h"
#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"
#include "tessel/kernels/attention/cuda/math_cuda.h"
#include "tessel/kernels/attention/cudnn/cudnn_sdpa.h"
#include "tessel/kernels/attention/cudnn/cudnn_sdpa_support.h"

namespace tessel::kernels {
namespace {

using attention::AttentionProblem;
using attention::AttentionView;

constexpr uint32_t kAllBackends = (1u << kSdpaBackendCount) - 1;
thread_local uint32_t t_allowed = kAllBackends;

uint32_t bit(SdpaBackend b) { return 1u << static_cast<int>(b); }

std::string cpu_only_reason(const AttentionProblem& p) {
  return p.q.device.is_cpu() ? std::string() : "tensors are on " + p.q.device.str();
}

// The reference: BLAS on the CPU, math_cuda.cu on CUDA devices.
class MathKernel final : public SdpaKernel {
 public:
  SdpaBackend backend() const override { return SdpaBackend::kMath; }
  int priority() const override { return 0; }
  std::string unsupported_reason(const AttentionProblem& p) const override {
    if (p.q.device.is_cuda() && !attention::math_cuda_is_available()) {
      return "tensors are on " + p.q.device.str() + " and this build has no CUDA";
    }
    if (!p.q.device.is_cpu() && !p.q.device.is_cuda()) {
      return "tensors are on " + p.q.device.str() + "; math runs CPU and CUDA tensors";
    }
    return {};
  }
  void forward(const AttentionProblem& p, const AttentionView& out, float* lse) const override {
    if (p.q.device.is_cuda()) {
      attention::math_cuda_forward(p, out, lse);
    } else {
      attention::math_attention_forward(p, out, lse);
    }
  }
  void backward(const AttentionProblem& p, const AttentionView&, const AttentionView& dout,
                const float*, const AttentionView& dq, const AttentionView& dk,
                const AttentionView& dv) const override {
    if (p.q.device.is_cuda()) {
      attention::math_cuda_backward(p, dout, dq, dk, dv);
    } else {
      attention::math_attention_backward(p, dout, dq, dk, dv);
    }
  }
};

class FlashCpuKernel final : public SdpaKernel {
 public:
  SdpaBackend backend() const override { return SdpaBackend::kFlashCpu; }
  int priority() const override { return 100; }
  std::string unsupported_reason(const AttentionProblem& p) const override {
    if (p.q.dtype == DType::kF16) return "dtype f16; flash_cpu supports f32 and bf16";
    return cpu_only_reason(p);
  }
  void forward(const AttentionProblem& p, const AttentionView& out, float* lse) const override {
    attention::flash_cpu_forward(p, out, lse);
  }
  void backward(const AttentionProblem& p, const AttentionView& out, const AttentionView& dout,
                const float* lse, const AttentionView& dq, const AttentionView& dk,
                const AttentionView& dv) const override {
    attention::flash_cpu_backward(p, out, dout, lse, dq, dk, dv);
  }
};

// FlashAttention-2 on CUDA (attention/cuda/flash_cuda.h).
class FlashCudaKernel final : public SdpaKernel {
 public:
  SdpaBackend backend() const override { return SdpaBackend::kFlashCuda; }
  int priority() const override { return 200; }
  std::string unsupported_reason(const AttentionProblem& p) const override {
    return attention::cuda::flash_cuda_unsupported_reason(p);
  }
  void forward(const AttentionProblem& p, const AttentionView& out, float* lse) const override {
    attention::flash_cuda_forward(p, out, lse);
  }
  void backward(const AttentionProblem& p, const AttentionView& out, const AttentionView& dout,
                const float* lse, const AttentionView& dq, const AttentionView& dk,
                const AttentionView& dv) const override {
    attention::flash_cuda_backward(p, out, dout, lse, dq, dk, dv);
  }
};

std::string describe(const AttentionProblem& p);

// cuDNN's fused attention (attention/cudnn/cudnn_sdpa.h): first choice on Hopper, where it is
// the fastest; below sm_90 after flash_cuda (still ahead of math, and runnable when forced).
// What cuDNN declines goes to flash_cuda with the reason recorded (cudnn_sdpa_fallbacks()): in
// forward through the dispatcher passing it over, in backward (whose graph is built only now)
// by running flash_cuda's backward on cuDNN's output and logsumexp.
class CudnnKernel final : public SdpaKernel {
 public:
  SdpaBackend backend() const override { return SdpaBackend::kCudnn; }
  int priority() const override { return 300; }
  int priority_for(const AttentionProblem& p) const override {
    return p.q.device.is_cuda() && attention::cuda_compute_capability(p.q.device.index) >= 90 ? 300
                                                                                              : 150;
  }
  std::string unsupported_reason(const AttentionProblem& p) const override {
    std::string why = attention::cudnn_sdpa_unsupported_reason(p);
    if (!why.empty() && p.q.device.is_cuda()) {
      attention::record_cudnn_sdpa_fallback(attention::SdpaDirection::kForward, describe(p), why);
    }
    return why;
  }
  void forward(const AttentionProblem& p, const AttentionView& out, float* lse) const override {
    attention::cudnn_sdpa_forward(p, out, lse);
  }
  void backward(const AttentionProblem& p, const AttentionView& out, const AttentionView& dout,
                const float* lse, const AttentionView& dq, const AttentionView& dk,
                const AttentionView& dv) const override {
    const std::string why =
        attention::cudnn_sdpa_backward_unsupported_reason(p, out, dout, dq, dk, dv);
    if (why.empty()) {
      attention::cudnn_sdpa_backward(p, out, dout, lse, dq, dk, dv);
      return;
    }
    attention::record_cudnn_sdpa_fallback(attention::SdpaDirection::kBackward, describe(p), why);
    attention::flash_cuda_backward(p, out, dout, lse, dq, dk, dv);
  }
};

// "bf16 q (2, 16, 4096, 128) kv (2, 4, 4096, 128) causal on cuda:0", for the debug log.
std::string describe(const AttentionProblem& p) {
  const AttentionView &q = p.q, &k = p.k;
  std::string mask;
  if (p.mask.causal)
    mask += p.mask.alignment == attention::MaskAlignment::kBottomRight ? " causal bottom-right"
                                                                       : " causal";
  if (p.mask.window_left >= 0 || p.mask.window_right >= 0) {
    mask += fmt::format(" window ({}, {})", p.mask.window_left, p.mask.window_right);
  }
  if (!p.mask.prefix_lengths.empty()) mask += " prefix";
  if (p.mask.has_documents()) mask += " documents";
  if (p.mask.mask_fn) mask += " mask_fn";
  if (p.dropout.p > 0) mask += fmt::format(" dropout {}", p.dropout.p);
  return fmt::format("{} q ({}, {}, {}, {}) kv ({}, {}, {}, {}){} on {}", dtype_name(q.dtype),
                     q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3], k.sizes[0], k.sizes[1],
                     k.sizes[2], k.sizes[3], mask, q.device.str());
}

struct Registry {
  std::mutex mu;
  std::unique_ptr<SdpaKernel> kernels[kSdpaBackendCount];
  Registry() {
    kernels[static_cast<int>(SdpaBackend::kMath)] = std::make_unique<MathKernel>();
    kernels[static_cast<int>(SdpaBackend::kFlashCpu)] = std::make_unique<FlashCpuKernel>();
    if (attention::flash_cuda_is_available()) {
      kernels[static_cast<int>(SdpaBackend::kFlashCuda)] = std::make_unique<FlashCudaKernel>();
    }
    if (attention::cudnn_sdpa_is_available()) {
      kernels[static_cast<int>(SdpaBackend::kCudnn)] = std::make_unique<CudnnKernel>();
    }
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: kernels may run during exit
  return *r;
}

}  // namespace

std::string_view sdpa_backend_name(SdpaBackend backend) {
  switch (backend) {
    case SdpaBackend::kMath:
      return "math";
    case SdpaBackend::kFlashCpu:
      return "flash_cpu";
    case SdpaBackend::kFlashCuda:
      return "flash_cuda";
    case SdpaBackend::kCudnn:
      return "cudnn";
  }
  return "?";
}

void register_sdpa_backend(std::unique_ptr<SdpaKernel> kernel) {
  TESSEL_CHECK(kernel != nullptr, InvalidArgument, "register_sdpa_backend: null kernel");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.kernels[static_cast<int>(kernel->backend())] = std::move(kernel);
}

const SdpaKernel* find_sdpa_backend(SdpaBackend backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.kernels[static_cast<int>(backend)].get();
}

SdpaBackendScope::SdpaBackendScope(std::vector<SdpaBackend> allowed) : previous_(t_allowed) {
  uint32_t mask = 0;
  for (SdpaBackend b : allowed) mask |= bit(b);
  t_allowed = previous_ & mask;
}

SdpaBackendScope::~SdpaBackendScope() { t_allowed = previous_; }

const SdpaKernel& select_sdpa_backend(const AttentionProblem& problem, const SdpaBackend* forced) {
  std::vector<std::pair<int, const SdpaKernel*>> candidates;
  for (int i = 0; i < kSdpaBackendCount; ++i) {
    if (const SdpaKernel* k = find_sdpa_backend(static_cast<SdpaBackend>(i))) {
      candidates.emplace_back(k->priority_for(problem), k);
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string reasons;
  for (const auto& [priority, k] : candidates) {
    std::string why;
    if (!(t_allowed & bit(k->backend()))) {
      why = "excluded by an SdpaBackendScope";
    } else if (forced && *forced != k->backend()) {
      why = fmt::format("options.backend is {}", sdpa_backend_name(*forced));
    } else {
      why = k->unsupported_reason(problem);
      if (why.empty()) {
        if (log_enabled(LogComponent::kKernels, LogLevel::kDebug)) {
          log_debug(LogComponent::kKernels, "scaled_dot_product_attention: {} for {}{}",
                    sdpa_backend_name(k->backend()), describe(problem),
                    reasons.empty() ? "" : fmt::format(" (passed over{})", reasons));
        }
        return *k;
      }
    }
    reasons += fmt::format("; {}: {}", sdpa_backend_name(k->backend()), why);
  }
  if (forced && !find_sdpa_backend(*forced)) {
    reasons += fmt::format("; {}: not built into this binary", sdpa_backend_name(*forced));
  }
  throw Unavailable(
      fmt::format("scaled_dot_product_attention: no backend can run this call{}", reasons));
}

}  // namespace tessel::kernels
