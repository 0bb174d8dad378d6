#include "tessel/kernels/attention/sdpa_backend.h"

#include <algorithm>
#include <mutex>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/attention_math.h"
#include "tessel/kernels/attention/attention_ops.h"
#include "tessel/kernels/attention/cpu/flash_cpu.h"

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

// The reference on the CPU; on other devices the same math composed of tensor ops
// (attention_ops.h), the plain attention a device has until a fused kernel is registered.
class MathKernel final : public SdpaKernel {
 public:
  SdpaBackend backend() const override { return SdpaBackend::kMath; }
  int priority() const override { return 0; }
  std::string unsupported_reason(const AttentionProblem& p) const override {
    return p.q.device.is_cpu() ? std::string() : attention::ops_attention_unsupported(p);
  }
  void forward(const AttentionProblem& p, const AttentionView& out, float* lse) const override {
    if (p.q.device.is_cpu()) {
      attention::math_attention_forward(p, out, lse);
    } else {
      attention::ops_attention_forward(p, out, lse);
    }
  }
  void backward(const AttentionProblem& p, const AttentionView& out, const AttentionView& dout,
                const float*, const AttentionView& dq, const AttentionView& dk,
                const AttentionView& dv) const override {
    if (p.q.device.is_cpu()) {
      attention::math_attention_backward(p, dout, dq, dk, dv);
    } else {
      attention::ops_attention_backward(p, out, dout, dq, dk, dv);
    }
  }
};

class FlashCpuKernel final : public SdpaKernel {
 public:
  SdpaBackend backend() const override { return SdpaBackend::kFlashCpu; }
  int priority() const override { return 100; }
  std::string unsupported_reason(const AttentionProblem& p) const override {
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

struct Registry {
  std::mutex mu;
  std::unique_ptr<SdpaKernel> kernels[kSdpaBackendCount];
  Registry() {
    kernels[static_cast<int>(SdpaBackend::kMath)] = std::make_unique<MathKernel>();
    kernels[static_cast<int>(SdpaBackend::kFlashCpu)] = std::make_unique<FlashCpuKernel>();
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: kernels may run during exit
  return *r;
}

}  // namespace

std::string_view sdpa_backend_name(SdpaBackend backend) {
  switch (backend) {
    case SdpaBackend::kMath: return "math";
    case SdpaBackend::kFlashCpu: return "flash_cpu";
    case SdpaBackend::kFlashCuda: return "flash_cuda";
    case SdpaBackend::kCudnn: return "cudnn";
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
  std::vector<const SdpaKernel*> candidates;
  for (int i = 0; i < kSdpaBackendCount; ++i) {
    if (const SdpaKernel* k = find_sdpa_backend(static_cast<SdpaBackend>(i))) {
      candidates.push_back(k);
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const SdpaKernel* a, const SdpaKernel* b) {
                     return a->priority() > b->priority();
                   });
  std::string reasons;
  for (const SdpaKernel* k : candidates) {
    std::string why;
    if (!(t_allowed & bit(k->backend()))) {
      why = "excluded by an SdpaBackendScope";
    } else if (forced && *forced != k->backend()) {
      why = fmt::format("options.backend is {}", sdpa_backend_name(*forced));
    } else {
      why = k->unsupported_reason(problem);
      if (why.empty()) return *k;
    }
    reasons += fmt::format("; {}: {}", sdpa_backend_name(k->backend()), why);
  }
  if (forced && !find_sdpa_backend(*forced)) {
    reasons += fmt::format("; {}: not built into this binary", sdpa_backend_name(*forced));
  }
  throw Unavailable(fmt::format("scaled_dot_product_attention: no backend can run this call{}",
                                reasons));
}

}  // namespace tessel::kernels
