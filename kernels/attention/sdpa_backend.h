#pragma once
// SDPA backends and their dispatch. A backend implements attention over raw views
// (AttentionProblem); the dispatcher picks the highest-priority backend that is allowed and
// can run a call, and SdpaBackendScope restricts the choice for a scope (like PyTorch's
// torch.nn.attention.sdpa_kernel). Built in: kMath (reference; CPU and CUDA), kFlashCpu,
// and — in builds with CUDA / cuDNN — kFlashCuda and kCudnn. With TESSEL_LOGS=kernels=debug
// every choice is logged with the reasons the other backends were passed over.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels {

enum class SdpaBackend : uint8_t { kMath, kFlashCpu, kFlashCuda, kCudnn };
inline constexpr int kSdpaBackendCount = 4;

std::string_view sdpa_backend_name(SdpaBackend backend);  // "math", "flash_cpu", ...

// One attention implementation. Implementations are stateless or internally synchronised:
// forward/backward may run on several threads at once.
class SdpaKernel {
 public:
  virtual ~SdpaKernel() = default;
  virtual SdpaBackend backend() const = 0;
  // Higher runs first when several can. Built-ins: cudnn 300 (on sm_90; 150 below),
  // flash_cuda 200, flash_cpu 100, math 0.
  virtual int priority() const = 0;
  // The priority for one problem (e.g. by the device's architecture); default priority().
  virtual int priority_for(const attention::AttentionProblem& problem) const {
    (void)problem;
    return priority();
  }
  // Empty when this kernel can run `problem` (already validated); otherwise the reason, e.g.
  // "tensors are on cuda:0".
  virtual std::string unsupported_reason(const attention::AttentionProblem& problem) const = 0;
  // out like q; lse contiguous (B, H_q, S_q) f32 in natural log. Throws tessel errors.
  virtual void forward(const attention::AttentionProblem& problem,
                       const attention::AttentionView& out, float* lse) const = 0;
  virtual void backward(const attention::AttentionProblem& problem,
                        const attention::AttentionView& out, const attention::AttentionView& dout,
                        const float* lse, const attention::AttentionView& dq,
                        const attention::AttentionView& dk,
                        const attention::AttentionView& dv) const = 0;
};

// Adds (or replaces) the kernel for its backend in the process-wide registry (one of the
// documented singletons). Thread-safe; kernels live until process exit.
void register_sdpa_backend(std::unique_ptr<SdpaKernel> kernel);
// The registered kernel for `backend`, or null.
const SdpaKernel* find_sdpa_backend(SdpaBackend backend);

// Restricts, on this thread and for its lifetime, the backends the dispatcher may choose to
// `allowed` (intersected with any enclosing scope). Scopes nest; the destructor restores the
// previous set. Not movable.
class SdpaBackendScope {
 public:
  explicit SdpaBackendScope(std::vector<SdpaBackend> allowed);
  explicit SdpaBackendScope(SdpaBackend only) : SdpaBackendScope(std::vector<SdpaBackend>{only}) {}
  ~SdpaBackendScope();
  SdpaBackendScope(const SdpaBackendScope&) = delete;
  SdpaBackendScope& operator=(const SdpaBackendScope&) = delete;

 private:
  uint32_t previous_;
};

// The kernel the dispatcher chooses for `problem`: registered, allowed by the scopes on this
// thread and by `forced` (when not null), able to run the problem, highest priority_for first.
// Throws Unavailable listing every backend considered and why it was not taken (for a forced
// backend, its reason names what it supports).
const SdpaKernel& select_sdpa_backend(const attention::AttentionProblem& problem,
                                      const SdpaBackend* forced = nullptr);

}  // namespace tessel::kernels
