// matmul, bmm and linear on the backend's GEMM (oneDNN on the CPU).
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/internal/op_util.h"
#include "tessel/tensor/ops.h"

namespace tessel {

namespace {

// The last two dims have a unit stride in one of them (what GEMM kernels take without a copy).
bool gemm_layout(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t rs = t.stride(-2), cs = t.stride(-1);
  const bool row_major = (cs == 1 || cols == 1) && (rs >= cols || rows == 1);
  const bool col_major = (rs == 1 || rows == 1) && (cs >= rows || cols == 1);
  return row_major || col_major;
}

// t with size-1 dims prepended up to `rank` (a view).
Tensor pad_rank(const Tensor& t, int64_t rank) {
  Shape shape = t.shape();
  Strides strides = t.strides();
  shape.insert(shape.begin(), rank - t.dim(), 1);
  strides.insert(strides.begin(), rank - t.dim(), 0);
  return t.as_strided(shape, strides, t.offset());
}

// Both operands at least 2-D, one dtype.
Tensor matmul_nd(const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.size(-1) == b.size(-2), InvalidArgument,
               "matmul: shapes {} and {} do not match (inner dims {} and {})",
               shape_str(a.shape()), shape_str(b.shape()), a.size(-1), b.size(-2));
  const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(b.shape().begin(), b.shape().end() - 2));
  const int64_t rank = static_cast<int64_t>(batch.size()) + 2;
  Shape out_shape = batch;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(b.size(-1));
  Tensor out;
  {
    NoGradGuard no_grad;
    const DType compute = a.dtype() == DType::kF16 ? DType::kF32 : a.dtype();
    Tensor ac = to(detach(a), compute), bc = to(detach(b), compute);
    if (!gemm_layout(ac)) ac = contiguous(ac);
    if (!gemm_layout(bc)) bc = contiguous(bc);
    out = empty(out_shape, compute, a.device());
    internal::backend_of(a).matmul(pad_rank(ac, rank), pad_rank(bc, rank), out);
    out = to(out, a.dtype());
  }
  if (needs_grad({a, b})) {
    // dA needs B and dB needs A: keep only the operands a gradient will use.
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    record_op("matmul", {a, b}, {out}, [ra, rb, sa = a.shape(), sb = b.shape(),
                                        a = rb ? detach(a) : Tensor(),
                                        b = ra ? detach(b) : Tensor()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{
          ra ? sum_to(matmul_nd(g[0], transpose(b, -1, -2)), sa) : Tensor(),
          rb ? sum_to(matmul_nd(transpose(a, -1, -2), g[0]), sb) : Tensor()};
    });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  internal::check_same_device("matmul", a, b);
  TESSEL_CHECK(a.dim() >= 1 && b.dim() >= 1, InvalidArgument,
               "matmul needs operands with at least 1 dim, got shapes {} and {}",
               shape_str(a.shape()), shape_str(b.shape()));
  TESSEL_CHECK(a.dtype() == b.dtype() && is_floating(a.dtype()), InvalidArgument,
               "matmul needs two floating tensors of one dtype, got {} ({}) and {} ({})",
               dtype_name(a.dtype()), shape_str(a.shape()), dtype_name(b.dtype()),
               shape_str(b.shape()));
  const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;
  const Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  Tensor out = matmul_nd(a2, b2);
  if (b.dim() == 1) out = squeeze(out, -1);
  if (a.dim() == 1) out = squeeze(out, a.dim() == 1 && b.dim() == 1 ? 0 : -2);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0), InvalidArgument,
               "bmm needs [B, M, K] and [B, K, N], got {} and {}", shape_str(a.shape()),
               shape_str(b.shape()));
  return matmul(a, b);
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSEL_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
               InvalidArgument, "linear: input of shape {} does not fit weight of shape {} "
               "(expected [out, {}])",
               shape_str(x.shape()), shape_str(weight.shape()), x.dim() >= 1 ? x.size(-1) : 0);
  // Fold leading dims into one GEMM.
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  Tensor y = matmul(reshape(x, {-1, x.size(-1)}), transpose(weight, 0, 1));
  if (bias.defined()) {
    TESSEL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), InvalidArgument,
                 "linear: bias of shape {} does not match weight of shape {}",
                 shape_str(bias.shape()), shape_str(weight.shape()));
    y = add(y, bias);
  }
  return reshape(y, out_shape);
}

}  // namespace tessel
