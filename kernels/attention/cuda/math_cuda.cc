// The math backend on CUDA, host side: checks, the mask, scratch, chunking, launches.
#define TESSEL_MATH_CUDA_LAUNCHERS 1

#include "tessel/kernels/attention/cuda/math_cuda.h"

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/kernels/attention/cuda/flash_cuda_plan.h"
#include "tessel/kernels/attention/cuda/internal/device_mask.h"
#include "tessel/kernels/attention/cuda/internal/math_params.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/stream.h"

namespace tessel::kernels::attention {
namespace {

using cuda::MathElem;
using cuda::MathParams;

constexpr int64_t kScratchBytes = int64_t{256} << 20;  // per scratch buffer

MathElem math_elem(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MathElem::kF32;
    case DType::kBF16:
      return MathElem::kBf16;
    case DType::kF16:
      return MathElem::kF16;
    default:
      break;
  }
  throw InvalidArgument(
      fmt::format("math_cuda: dtype {}; expected f32, bf16 or f16", dtype_name(dtype)));
}

// The parameters common to forward and backward, and the chunking: key/value heads in groups
// whose S_q x S_k scratch stays near kScratchBytes (at least one per chunk).
struct MathCall {
  MathParams params;
  int64_t kv_units = 0;  // B * H_kv
  int64_t chunk = 1;     // key/value heads per chunk
  Tensor probs, grads;

  MathCall(const AttentionProblem& pr, const cuda::DeviceMask& mask, bool backward) {
    MathParams& p = params;
    p.q = cuda::device_view(pr.q);
    p.k = cuda::device_view(pr.k);
    p.v = cuda::device_view(pr.v);
    p.elem = math_elem(pr.q.dtype);
    p.batch = static_cast<int>(pr.batch());
    p.q_heads = static_cast<int>(pr.q_heads());
    p.kv_heads = static_cast<int>(std::max<int64_t>(1, pr.kv_heads()));
    p.q_len = static_cast<int>(pr.q_len());
    p.kv_len = static_cast<int>(pr.kv_len());
    p.head_dim = static_cast<int>(pr.head_dim());
    p.scale = static_cast<float>(pr.softmax_scale());
    p.mask = mask.params();
    p.dropout = cuda::make_dropout_params(pr);
    kv_units = pr.batch() * pr.kv_heads();
    const int64_t per_unit = std::max<int64_t>(1, p.group() * pr.q_len() * pr.kv_len());
    chunk = std::clamp<int64_t>(kScratchBytes / 4 / per_unit, 1, std::max<int64_t>(1, kv_units));
    probs = empty({chunk * per_unit}, DType::kF32, pr.q.device);
    p.probs = probs.data<float>();
    if (backward) {
      grads = empty({chunk * per_unit}, DType::kF32, pr.q.device);
      p.grads = grads.data<float>();
    }
  }
};

void check_problem(const AttentionProblem& p) {
  validate_attention_problem(p);
  TESSEL_CHECK(p.q.device.is_cuda(), InvalidArgument,
               "math_cuda: tensors are on {}; expected a CUDA device", p.q.device.str());
  TESSEL_CHECK(p.q_len() < (int64_t{1} << 30) && p.kv_len() < (int64_t{1} << 30), InvalidArgument,
               "math_cuda: sequence lengths {} and {}; expected below 2^30", p.q_len(), p.kv_len());
  math_elem(p.q.dtype);
}

void check_output(const AttentionView& view, const AttentionView& like, const char* what) {
  validate_attention_output(view, like, what);
  TESSEL_CHECK(view.dtype == like.dtype, InvalidArgument,
               "math_cuda: {} has dtype {}; expected {} like the inputs", what,
               dtype_name(view.dtype), dtype_name(like.dtype));
}

cudaStream_t stream_of(Device device) {
  return static_cast<cudaStream_t>(current_stream(device).native_handle());
}

}  // namespace

bool math_cuda_is_available() { return true; }

void math_cuda_forward(const AttentionProblem& problem, const AttentionView& out, float* lse) {
  check_problem(problem);
  check_output(out, problem.q, "out");
  if (problem.batch() == 0 || problem.q_heads() == 0 || problem.q_len() == 0) return;
  const Device device = problem.q.device;
  tessel::cuda::DeviceGuard guard(device.index);
  const cudaStream_t stream = stream_of(device);
  const cuda::DeviceMask mask(cuda::make_mask_plan(problem), device, stream);
  MathCall call(problem, mask, /*backward=*/false);
  MathParams& p = call.params;
  p.out = cuda::device_view(out);
  p.lse = lse;
  for (int64_t kv0 = 0; kv0 < call.kv_units; kv0 += call.chunk) {
    p.kv0 = kv0;
    p.kv_count = std::min(call.chunk, call.kv_units - kv0);
    cuda::launch_math_forward(p, stream);
  }
}

void math_cuda_backward(const AttentionProblem& problem, const AttentionView& dout,
                        const AttentionView& dq, const AttentionView& dk, const AttentionView& dv) {
  check_problem(problem);
  check_output(dout, problem.q, "dout");
  check_output(dq, problem.q, "dq");
  check_output(dk, problem.k, "dk");
  check_output(dv, problem.v, "dv");
  if (problem.batch() == 0 || problem.kv_heads() == 0) return;
  const Device device = problem.q.device;
  tessel::cuda::DeviceGuard guard(device.index);
  const cudaStream_t stream = stream_of(device);
  const cuda::DeviceMask mask(cuda::make_mask_plan(problem), device, stream);
  MathCall call(problem, mask, /*backward=*/true);
  MathParams& p = call.params;
  p.dout = cuda::device_view(dout);
  p.dq = cuda::device_view(dq);
  p.dk = cuda::device_view(dk);
  p.dv = cuda::device_view(dv);
  for (int64_t kv0 = 0; kv0 < call.kv_units; kv0 += call.chunk) {
    p.kv0 = kv0;
    p.kv_count = std::min(call.chunk, call.kv_units - kv0);
    cuda::launch_math_backward(p, stream);
  }
}

}  // namespace tessel::kernels::attention
