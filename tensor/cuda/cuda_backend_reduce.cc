// The CUDA backend's host code for reductions and argmax: the reduced dims become contiguous
// rows (or, for leading dims of a contiguous tensor, columns) of a 2-D problem; other layouts
// are first copied with the reduced dims last, as the CPU backend does.
#include "tessel/base/error.h"
#include "tessel/tensor/cuda/cuda_backend.h"
#include "tessel/tensor/cuda/cuda_runtime.h"
#include "tessel/tensor/internal/reduce_layout.h"

namespace tessel::cuda {
namespace {

// A contiguous copy of x with `dims` (sorted) moved last: one row per output element.
Tensor copy_to_rows(const Tensor& x, const std::vector<int64_t>& dims) {
  const Tensor view = internal::reduced_dims_last(x, dims);
  Tensor rows = empty(view.shape(), x.dtype(), x.device());
  cuda_backend().copy(view, rows);
  return rows;
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims,
                         const Tensor& out) {
  const int64_t outputs = out.numel();
  if (outputs == 0) return;
  const int64_t r = x.numel() / outputs;
  TESSEL_CHECK(r > 0 || op == ReduceOp::kSum || op == ReduceOp::kProduct, InvalidArgument,
               "cannot take the {} over an empty dimension of {}", reduce_op_name(op),
               shape_str(x.shape()));
  const internal::ReduceLayout layout = internal::reduce_layout_of(x, dims);
  const bool cols = layout == internal::ReduceLayout::kColumns;
  const Tensor src = layout == internal::ReduceLayout::kCopyToRows ? copy_to_rows(x, dims) : x;
  DeviceScope s(x.device());
  if (cols) {
    const Scratch tmp(reduce_cols_scratch_bytes(r, outputs), x.device());
    launch_reduce_cols(s.launch, op, src.data_ptr(), src.dtype(), out.data_ptr(), out.dtype(), r,
                       outputs, tmp.get());
  } else {
    const Scratch tmp(reduce_rows_scratch_bytes(outputs, r), x.device());
    launch_reduce_rows(s.launch, op, src.data_ptr(), src.dtype(), out.data_ptr(), out.dtype(),
                       outputs, r, tmp.get());
  }
}

void CudaBackend::argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  const int64_t outputs = out.numel();
  if (outputs == 0) return;
  const int64_t r = x.shape()[dim];
  TESSEL_CHECK(r > 0, InvalidArgument, "cannot take the argmax over an empty dimension of {}",
               shape_str(x.shape()));
  const Tensor src = x.is_contiguous() && dim == x.dim() - 1 ? x : copy_to_rows(x, {dim});
  DeviceScope s(x.device());
  launch_argmax_rows(s.launch, src.data_ptr(), src.dtype(), out.data<int64_t>(), outputs, r);
}

}  // namespace tessel::cuda
