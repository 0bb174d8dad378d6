// The grouped matmul on CUDA, host side: checks, the device and stream, launches.
#define TESSEL_LLAMA_CUDA_LAUNCHERS 1

#include "tessel/kernels/moe/cuda/grouped_matmul_cuda.h"

#include <initializer_list>

#include "tessel/base/error.h"
#include "tessel/kernels/moe/cuda/internal/grouped_matmul_cuda_params.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/stream.h"

namespace tessel::kernels {
namespace {

using cuda::LlamaElem;

// The element type of `dtype`, and every tensor contiguous on x's CUDA device; offsets i64.
LlamaElem check_operands(const char* what, std::initializer_list<const Tensor*> tensors,
                         const Tensor& offsets) {
  const Tensor& first = **tensors.begin();
  const DType dtype = first.dtype();
  TESSEL_CHECK(first.device().is_cuda(), InvalidArgument,
               "{}: tensors are on {}; expected a CUDA device", what, first.device().str());
  for (const Tensor* t : tensors) {
    TESSEL_CHECK(t->device() == first.device() && t->dtype() == dtype && t->is_contiguous(),
                 InvalidArgument, "{}: {} on {}; expected contiguous {} on {}", what, t->str(),
                 t->device().str(), dtype_name(dtype), first.device().str());
  }
  TESSEL_CHECK(offsets.device() == first.device() && offsets.dtype() == DType::kI64 &&
                   offsets.is_contiguous() && offsets.dim() == 1,
               InvalidArgument, "{}: offsets {}; expected contiguous i64 (G + 1) on {}", what,
               offsets.str(), first.device().str());
  switch (dtype) {
    case DType::kF32:
      return LlamaElem::kF32;
    case DType::kBF16:
      return LlamaElem::kBf16;
    case DType::kF16:
      return LlamaElem::kF16;
    default:
      throw InvalidArgument(
          fmt::format("{}: dtype {}; expected f32, bf16 or f16", what, dtype_name(dtype)));
  }
}

cudaStream_t stream_of(Device device) {
  return static_cast<cudaStream_t>(current_stream(device).native_handle());
}

}  // namespace

bool grouped_matmul_cuda_is_available() { return true; }

void grouped_matmul_cuda(const Tensor& x, const Tensor& w, const Tensor& offsets, bool transpose_w,
                         const Tensor& out) {
  const LlamaElem elem = check_operands("grouped_matmul_cuda", {&x, &w, &out}, offsets);
  const int64_t G = w.size(0), K = w.size(1), N = w.size(2);
  const int64_t inner = transpose_w ? N : K, cols = transpose_w ? K : N;
  TESSEL_CHECK(x.dim() == 2 && x.size(1) == inner && out.dim() == 2 && out.size(0) == x.size(0) &&
                   out.size(1) == cols && offsets.size(0) == G + 1,
               InvalidArgument,
               "grouped_matmul_cuda: x {}, w {}, out {}, offsets {} (transpose_w {}) do not fit",
               x.str(), w.str(), out.str(), offsets.str(), transpose_w);
  cuda::GroupedMatmulParams p;
  p.a = x.data_ptr();
  p.b = w.data_ptr();
  p.out = out.data_ptr();
  p.offsets = offsets.data<int64_t>();
  p.groups = G;
  p.rows = x.size(0);
  p.inner = inner;
  p.cols = cols;
  p.b_group = K * N;
  p.b_inner = transpose_w ? 1 : N;
  p.b_col = transpose_w ? N : 1;
  if (p.rows * p.cols == 0 || G == 0) return;
  tessel::cuda::DeviceGuard guard(x.device().index);
  cuda::launch_grouped_matmul(p, elem, stream_of(x.device()));
}

void grouped_matmul_cuda_weight_grad(const Tensor& x, const Tensor& dy, const Tensor& offsets,
                                     const Tensor& dw) {
  const LlamaElem elem = check_operands("grouped_matmul_cuda_weight_grad", {&x, &dy, &dw}, offsets);
  TESSEL_CHECK(
      x.dim() == 2 && dy.dim() == 2 && dw.dim() == 3 && x.size(0) == dy.size(0) &&
          dw.size(1) == x.size(1) && dw.size(2) == dy.size(1) && offsets.size(0) == dw.size(0) + 1,
      InvalidArgument, "grouped_matmul_cuda_weight_grad: x {}, dy {}, dw {}, offsets {} do not fit",
      x.str(), dy.str(), dw.str(), offsets.str());
  cuda::GroupedWeightGradParams p;
  p.x = x.data_ptr();
  p.dy = dy.data_ptr();
  p.dw = dw.data_ptr();
  p.offsets = offsets.data<int64_t>();
  p.groups = dw.size(0);
  p.inner = dw.size(1);
  p.cols = dw.size(2);
  if (dw.numel() == 0) return;
  tessel::cuda::DeviceGuard guard(x.device().index);
  cuda::launch_grouped_weight_grad(p, elem, stream_of(x.device()));
}

}  // namespace tessel::kernels
