// The Llama kernels on CUDA, host side: checks, the device and stream, launches.
#define TESSEL_LLAMA_CUDA_LAUNCHERS 1

#include "tessel/kernels/llama/cuda/llama_cuda.h"

#include <initializer_list>

#include "tessel/base/error.h"
#include "tessel/kernels/llama/cuda/internal/llama_cuda_params.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/stream.h"

namespace tessel::kernels {
namespace {

using cuda::LlamaElem;

LlamaElem llama_elem(DType dtype, const char* what) {
  switch (dtype) {
    case DType::kF32:
      return LlamaElem::kF32;
    case DType::kBF16:
      return LlamaElem::kBf16;
    case DType::kF16:
      return LlamaElem::kF16;
    default:
      break;
  }
  throw InvalidArgument(
      fmt::format("{}: dtype {}; expected f32, bf16 or f16", what, dtype_name(dtype)));
}

// Every tensor contiguous, on the first one's CUDA device, of `dtype`.
void check_operands(const char* what, std::initializer_list<const Tensor*> tensors, DType dtype) {
  const Device device = (*tensors.begin())->device();
  TESSEL_CHECK(device.is_cuda(), InvalidArgument, "{}: tensors are on {}; expected a CUDA device",
               what, device.str());
  for (const Tensor* t : tensors) {
    TESSEL_CHECK(t->device() == device && t->dtype() == dtype && t->is_contiguous(),
                 InvalidArgument, "{}: {} on {}; expected contiguous {} on {}", what, t->str(),
                 t->device().str(), dtype_name(dtype), device.str());
  }
}

cudaStream_t stream_of(Device device) {
  return static_cast<cudaStream_t>(current_stream(device).native_handle());
}

}  // namespace

bool llama_cuda_is_available() { return true; }

void rope_cuda(const Tensor& x, const Tensor& cos, const Tensor& sin, float sign,
               const Tensor& out) {
  const LlamaElem elem = llama_elem(x.dtype(), "rope_cuda");
  check_operands("rope_cuda", {&x, &out}, x.dtype());
  check_operands("rope_cuda", {&x, &cos, &sin}, DType::kF32);
  TESSEL_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && out.shape() == x.shape(), InvalidArgument,
               "rope_cuda: x {} and out {}; expected one shape (B, T, H, D) with even D", x.str(),
               out.str());
  const int64_t B = x.size(0), T = x.size(1), half = x.size(3) / 2;
  TESSEL_CHECK(cos.shape() == sin.shape() &&
                   (cos.shape() == Shape{T, half} || cos.shape() == Shape{B, T, half}),
               InvalidArgument, "rope_cuda: tables {} and {}; expected ({}, {}) or ({}, {}, {})",
               cos.str(), sin.str(), T, half, B, T, half);
  cuda::RopeParams p;
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.cos = cos.data<float>();
  p.sin = sin.data<float>();
  p.rows = B * T;
  p.seq = T;
  p.heads = x.size(2);
  p.half = half;
  p.sign = sign;
  p.batched_tables = cos.dim() == 3;
  if (p.pairs() == 0) return;
  tessel::cuda::DeviceGuard guard(x.device().index);
  cuda::launch_rope(p, elem, stream_of(x.device()));
}

void swiglu_cuda_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const LlamaElem elem = llama_elem(gate.dtype(), "swiglu_cuda");
  check_operands("swiglu_cuda", {&gate, &up, &out}, gate.dtype());
  TESSEL_CHECK(up.shape() == gate.shape() && out.shape() == gate.shape(), InvalidArgument,
               "swiglu_cuda: gate {}, up {} and out {}; expected one shape", gate.str(), up.str(),
               out.str());
  cuda::SwigluParams p;
  p.gate = gate.data_ptr();
  p.up = up.data_ptr();
  p.out = out.data_ptr();
  p.n = gate.numel();
  if (p.n == 0) return;
  tessel::cuda::DeviceGuard guard(gate.device().index);
  cuda::launch_swiglu_forward(p, elem, stream_of(gate.device()));
}

void swiglu_cuda_backward(const Tensor& grad, const Tensor& gate, const Tensor& up,
                          const Tensor& grad_gate, const Tensor& grad_up) {
  const LlamaElem elem = llama_elem(gate.dtype(), "swiglu_cuda");
  check_operands("swiglu_cuda", {&gate, &grad, &up, &grad_gate, &grad_up}, gate.dtype());
  for (const Tensor* t : {&grad, &up, &grad_gate, &grad_up}) {
    TESSEL_CHECK(t->shape() == gate.shape(), InvalidArgument,
                 "swiglu_cuda: {} beside gate {}; expected one shape", t->str(), gate.str());
  }
  cuda::SwigluParams p;
  p.grad = grad.data_ptr();
  p.gate = gate.data_ptr();
  p.up = up.data_ptr();
  p.grad_gate = grad_gate.data_ptr();
  p.grad_up = grad_up.data_ptr();
  p.n = gate.numel();
  if (p.n == 0) return;
  tessel::cuda::DeviceGuard guard(gate.device().index);
  cuda::launch_swiglu_backward(p, elem, stream_of(gate.device()));
}

}  // namespace tessel::kernels
