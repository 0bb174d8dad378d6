// flash_cuda's host side: checks, the plan, mask uploads, scratch, launches.
#include "tessel/kernels/attention/cuda/flash_cuda.h"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"
#include "tessel/kernels/attention/cuda/internal/device_mask.h"
#include "tessel/kernels/attention/cuda/internal/flash_launch.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/stream.h"

namespace tessel::kernels::attention {
namespace cuda {
namespace {

// Pinned host buffers that mask arrays pass through on their way to a device: the copy from
// pageable memory would first wait for all earlier work of the stream. kSlots buffers are used
// in turn; a slot is refilled only after its previous copy has completed (its event), so the
// host may run kSlots calls ahead of the device. One ring per process (never destroyed: calls
// may run during exit), guarded by a mutex.
class StagingRing {
 public:
  static StagingRing& instance() {
    static StagingRing* ring = new StagingRing();
    return *ring;
  }

  // Copies `bytes` from `src` to `dst` (device) on `stream`, asynchronously.
  void copy_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (s.event != nullptr) TESSEL_CUDA_CHECK(cudaEventSynchronize(s.event));
    if (s.capacity < bytes) {
      if (s.data != nullptr) TESSEL_CUDA_CHECK(cudaFreeHost(s.data));
      s.data = nullptr;
      s.capacity = 0;
      TESSEL_CUDA_CHECK(cudaMallocHost(&s.data, bytes));
      s.capacity = bytes;
    }
    std::memcpy(s.data, src, bytes);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(dst, s.data, bytes, cudaMemcpyHostToDevice, stream));
    if (s.event == nullptr)
      TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
    TESSEL_CUDA_CHECK(cudaEventRecord(s.event, stream));
  }

 private:
  static constexpr int kSlots = 8;
  struct Slot {
    void* data = nullptr;
    size_t capacity = 0;
    cudaEvent_t event = nullptr;
  };
  std::mutex mu_;
  std::array<Slot, kSlots> slots_;
  int next_ = 0;
};

template <typename T>
const T* upload(const std::vector<T>& host, DType dtype, Device device, cudaStream_t stream,
                std::vector<Tensor>& keep) {
  if (host.empty()) return nullptr;
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  Tensor t = empty({static_cast<int64_t>(host.size())}, dtype, device);
  StagingRing::instance().copy_to_device(t.data_ptr(), host.data(), host.size() * sizeof(T),
                                         stream);
  keep.push_back(t);
  return static_cast<const T*>(t.data_ptr());
}

cudaStream_t stream_of(Device device) {
  return static_cast<cudaStream_t>(current_stream(device).native_handle());
}

void check_supported(const AttentionProblem& p) {
  validate_attention_problem(p);
  const std::string why = flash_cuda_unsupported_reason(p);
  TESSEL_CHECK(why.empty(), InvalidArgument, "flash_cuda: {}", why);
}

void check_output(const AttentionView& view, const AttentionView& like, const char* what) {
  validate_attention_output(view, like, what);
  const std::string why = flash_cuda_output_reason(view, like, what);
  TESSEL_CHECK(why.empty(), InvalidArgument, "flash_cuda: {}", why);
}

}  // namespace

DeviceMask::DeviceMask(const MaskPlan& plan, Device device, cudaStream_t stream)
    : params_(plan.params) {
  const int32_t* tiles = upload(plan.tiles, DType::kI32, device, stream, arrays_);
  const uint64_t* bits = upload(plan.bits, DType::kI64, device, stream, arrays_);
  const int32_t* prefix = upload(plan.prefix, DType::kI32, device, stream, arrays_);
  const int32_t* q_docs = upload(plan.q_docs, DType::kI32, device, stream, arrays_);
  const int32_t* kv_docs = upload(plan.kv_docs, DType::kI32, device, stream, arrays_);
  set_mask_arrays(params_, plan, tiles, bits, prefix, q_docs, kv_docs);
}

void allow_dynamic_smem(const void* kernel, int bytes) {
  if (bytes <= 48 * 1024) return;
  int device = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> granted;  // (kernel, device) -> bytes
  std::lock_guard<std::mutex> lock(mu);
  int& have = granted[{kernel, device}];
  if (have >= bytes) return;
  int optin = 0;
  TESSEL_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TESSEL_CHECK(bytes <= optin, Unavailable,
               "flash_cuda: a kernel needs {} bytes of shared memory per block; device {} "
               "allows {} (flash_cuda targets sm_80 and sm_90)",
               bytes, device, optin);
  TESSEL_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  have = bytes;
}

}  // namespace cuda

bool flash_cuda_is_available() { return true; }

int cuda_compute_capability(int index) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cache{};  // 0: not read yet, -1: unknown
  if (index < 0 || index >= kMaxDevices) return 0;
  int cc = cache[index].load(std::memory_order_relaxed);
  if (cc == 0) {
    int major = 0, minor = 0;
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) == cudaSuccess;
    if (!ok) cudaGetLastError();  // clear the error so that later calls do not report it
    cc = ok ? major * 10 + minor : -1;
    cache[index].store(cc, std::memory_order_relaxed);
  }
  return cc > 0 ? cc : 0;
}

void flash_cuda_forward(const AttentionProblem& p, const AttentionView& out, float* lse) {
  cuda::check_supported(p);
  cuda::check_output(out, p.q, "out");
  if (p.batch() == 0 || p.q_heads() == 0 || p.q_len() == 0) return;
  const Device device = p.q.device;
  tessel::cuda::DeviceGuard guard(device.index);
  const cudaStream_t stream = cuda::stream_of(device);
  cuda::FlashPlan plan = cuda::make_flash_plan(p);
  const cuda::DeviceMask mask(plan.mask, device, stream);
  plan.params.mask = mask.params();
  plan.params.out = cuda::device_view(out);
  Tensor lse_scratch;
  if (lse == nullptr) {
    lse_scratch = empty({p.batch() * p.q_heads() * p.q_len()}, DType::kF32, device);
    lse = lse_scratch.data<float>();
  }
  plan.params.lse = lse;
  cuda::launch_flash_forward(plan.params, plan.elem, plan.kernel_head_dim, stream);
}

void flash_cuda_backward(const AttentionProblem& p, const AttentionView& out,
                         const AttentionView& dout, const float* lse, const AttentionView& dq,
                         const AttentionView& dk, const AttentionView& dv) {
  cuda::check_supported(p);
  cuda::check_output(out, p.q, "out");
  cuda::check_output(dout, p.q, "dout");
  cuda::check_output(dq, p.q, "dq");
  cuda::check_output(dk, p.k, "dk");
  cuda::check_output(dv, p.v, "dv");
  TESSEL_CHECK(lse != nullptr || p.q_len() == 0 || p.batch() == 0, InvalidArgument,
               "flash_cuda_backward: lse is null; pass the forward's logsumexp");
  if (p.batch() == 0 || p.q_heads() == 0) return;
  const Device device = p.q.device;
  tessel::cuda::DeviceGuard guard(device.index);
  const cudaStream_t stream = cuda::stream_of(device);
  cuda::FlashPlan plan = cuda::make_flash_plan(p);
  const cuda::DeviceMask mask(plan.mask, device, stream);
  cuda::FlashParams& f = plan.params;
  f.mask = mask.params();
  f.out = cuda::device_view(out);
  f.dout = cuda::device_view(dout);
  f.dq = cuda::device_view(dq);
  f.dk = cuda::device_view(dk);
  f.dv = cuda::device_view(dv);
  f.lse = const_cast<float*>(lse);
  const int64_t rows = p.batch() * p.q_heads() * p.q_len();
  const Tensor delta = empty({std::max<int64_t>(rows, 1)}, DType::kF32, device);
  f.delta = delta.data<float>();
  Tensor dq_accum;
  if (!p.deterministic) {
    dq_accum = empty({std::max<int64_t>(rows * plan.kernel_head_dim, 1)}, DType::kF32, device);
    f.dq_accum = dq_accum.data<float>();
  }
  // GQA/MQA: the query heads of a group compute partial dK, dV in parallel (flash_cuda.h).
  Tensor dkdv_accum;
  if (const int64_t floats = cuda::flash_backward_dkdv_workspace_floats(plan); floats > 0) {
    dkdv_accum = empty({floats}, DType::kF32, device);
    f.dk_accum = dkdv_accum.data<float>();
    f.dv_accum = f.dk_accum + floats / 2;
  }
  cuda::launch_flash_backward(f, plan.elem, plan.kernel_head_dim, stream);
}

}  // namespace tessel::kernels::attention
