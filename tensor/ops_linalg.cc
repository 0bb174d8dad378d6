// matmul, bmm and linear on the backend's GEMM (oneDNN on the CPU). Under autocast
// (tensor/autocast.h) they compute in the autocast dtype.
#include "tessel/tensor/autocast.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/deferred_grad.h"
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
               "matmul: shapes {} and {} do not match (inner dims {} and {})", shape_str(a.shape()),
               shape_str(b.shape()), a.size(-1), b.size(-2));
  const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(b.shape().begin(), b.shape().end() - 2));
  const int64_t rank = static_cast<int64_t>(batch.size()) + 2;
  Shape out_shape = batch;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(b.size(-1));
  Tensor out;
  OpOutputCache* cache = op_output_cache();
  if (cache != nullptr && cache->mode() == OpOutputCache::Mode::kReplay) {
    out = cache->take("matmul")[0];  // kept by the first forward (selective recomputation)
  } else {
    NoGradGuard no_grad;
    OpOutputCacheGuard no_cache(nullptr);
    const DType compute = a.dtype() == DType::kF16 ? DType::kF32 : a.dtype();
    Tensor ac = to(detach(a), compute), bc = to(detach(b), compute);
    if (!gemm_layout(ac)) ac = contiguous(ac);
    if (!gemm_layout(bc)) bc = contiguous(bc);
    out = empty(out_shape, compute, a.device());
    internal::backend_of(a).matmul(pad_rank(ac, rank), pad_rank(bc, rank), out);
    out = to(out, a.dtype());
    if (cache != nullptr) cache->store("matmul", {out});
  }
  if (needs_grad({a, b})) {
    // dA needs B and dB needs A: keep only the operands a gradient will use.
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    record_op("matmul", {a, b}, {out},
              [ra, rb, sa = a.shape(), sb = b.shape(), a = rb ? detach(a) : Tensor(),
               b = ra ? detach(b) : Tensor()](const std::vector<Tensor>& g) {
                return std::vector<Tensor>{
                    ra ? sum_to(matmul_nd(g[0], transpose(b, -1, -2)), sa) : Tensor(),
                    rb ? sum_to(matmul_nd(transpose(a, -1, -2), g[0]), sb) : Tensor()};
              });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  internal::check_same_device("matmul", a_in, b_in);
  const Tensor a = autocast_cast(a_in, AutocastCategory::kLowerPrecision);
  const Tensor b = autocast_cast(b_in, AutocastCategory::kLowerPrecision);
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

namespace {

// The dtype a gradient of an input of dtype `want` is computed in by a GEMM over `compute`
// operands: the input's own when the kernel can write it (f32 accumulators are never rounded
// to bf16 first), else the compute dtype (autograd converts it).
DType gemm_grad_dtype(DType want, DType compute) {
  return want == compute || want == DType::kF32 ? want : compute;
}

// linear in one node: y = x @ w^T + b with the bias in the GEMM's epilogue; backward
// dx = g @ w, dw = g^T @ x (no transposed copy) and db = column sums of g, each written in
// its input's dtype when that is f32 (so f32 master weights under autocast get gradients that
// were never rounded to bf16). `compute` is f32 or bf16; x and weight are cast to it here, and
// the bias has it or is f32.
Tensor fused_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, DType compute) {
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor xc, wc, out;
  {
    NoGradGuard no_grad;
    xc = reshape(to(detach(x), compute), {rows, in});
    if (!gemm_layout(xc)) xc = contiguous(xc);
    wc = to(detach(weight), compute);
    if (!gemm_layout(wc)) wc = contiguous(wc);
  }
  OpOutputCache* cache = op_output_cache();
  if (cache != nullptr && cache->mode() == OpOutputCache::Mode::kReplay) {
    out = cache->take("linear")[0];  // kept by the first forward (selective recomputation)
  } else {
    NoGradGuard no_grad;
    out = empty(out_shape, compute, x.device());
    const Tensor out2 = out.as_strided({xc.size(0), out_features}, {out_features, 1}, 0);
    Backend& backend = internal::backend_of(x);
    if (bias.defined()) {
      backend.addmm(contiguous(detach(bias)), xc, transpose(wc, 0, 1), out2);
    } else {
      backend.matmul(xc, transpose(wc, 0, 1), out2);
    }
    if (cache != nullptr) cache->store("linear", {out});
  }
  if (needs_grad({x, weight, bias})) {
    const bool rx = x.requires_grad(), rw = weight.requires_grad();
    const bool rb = bias.defined() && bias.requires_grad();
    // Under a DeferWeightGradsGuard the weight and bias gradients wait for the store's run()
    // (zero-bubble's W); only leaves can wait (a non-leaf's node is freed by this pass).
    const bool deferrable = (!rw || is_leaf(weight)) && (!rb || is_leaf(bias)) && (rw || rb);
    record_op(
        "linear", {x, weight, bias}, {out},
        [rx, rw, rb, compute, rows, x_shape = x.shape(), x_dtype = x.dtype(),
         w_dtype = weight.dtype(), b_dtype = bias.defined() ? bias.dtype() : compute,
         xc = rw ? xc : Tensor(), wc = rx ? wc : Tensor(),
         weight = deferrable && rw ? weight : Tensor(),
         bias = deferrable && rb ? bias : Tensor()](const std::vector<Tensor>& g) {
          const int64_t n = g[0].size(-1);
          const Tensor g2 = contiguous(reshape(g[0], {rows, n}));
          Backend& backend = internal::backend_of(g2);
          Tensor dx;
          if (rx) {
            dx = empty({g2.size(0), wc.size(1)}, gemm_grad_dtype(x_dtype, compute), g2.device());
            backend.matmul(g2, wc, dx);
            dx = reshape(dx, x_shape);
          }
          // dW = g^T @ x and db = column sums of g.
          auto weight_grads = [rw, rb, n, compute, w_dtype, b_dtype, g2, xc] {
            Backend& b = internal::backend_of(g2);
            Tensor dw, db;
            if (rw) {
              dw = empty({n, xc.size(1)}, gemm_grad_dtype(w_dtype, compute), g2.device());
              b.matmul(transpose(g2, 0, 1), xc, dw);
            }
            if (rb) {
              db = empty({1, n}, gemm_grad_dtype(b_dtype, compute), g2.device());
              b.reduce(ReduceOp::kSum, g2, {0}, db);
              db = db.as_strided({n}, {1}, 0);
            }
            return std::vector<Tensor>{dw, db};
          };
          DeferredWeightGrads* store = deferred_weight_grads();
          if (store != nullptr && (weight.defined() || bias.defined())) {
            std::vector<Tensor> leaves;
            if (rw) leaves.push_back(weight);
            if (rb) leaves.push_back(bias);
            store->defer(std::move(leaves), [rw, rb, weight_grads] {
              std::vector<Tensor> grads = weight_grads();
              std::vector<Tensor> out;
              if (rw) out.push_back(std::move(grads[0]));
              if (rb) out.push_back(std::move(grads[1]));
              return out;
            });
            return std::vector<Tensor>{dx, Tensor(), Tensor()};
          }
          std::vector<Tensor> grads = weight_grads();
          return std::vector<Tensor>{dx, std::move(grads[0]), std::move(grads[1])};
        });
  }
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSEL_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), InvalidArgument,
               "linear: input of shape {} does not fit weight of shape {} "
               "(expected [out, {}])",
               shape_str(x.shape()), shape_str(weight.shape()), x.dim() >= 1 ? x.size(-1) : 0);
  internal::check_same_device("linear", x, weight);
  if (bias.defined()) {
    TESSEL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), InvalidArgument,
                 "linear: bias of shape {} does not match weight of shape {}",
                 shape_str(bias.shape()), shape_str(weight.shape()));
    internal::check_same_device("linear", x, bias);
  }
  const bool autocast =
      autocast_enabled(x.device().type) && is_floating(x.dtype()) && is_floating(weight.dtype());
  const DType compute = autocast ? autocast_dtype(x.device().type) : x.dtype();
  // The fused node takes f32 and bf16 computations; a bias of another dtype keeps add()'s
  // promotion (bf16 x and weight with an f32 bias give f32) outside autocast.
  const bool bias_fits =
      !bias.defined() || bias.dtype() == compute || (autocast && bias.dtype() == DType::kF32);
  if ((compute == DType::kF32 || compute == DType::kBF16) && bias_fits &&
      (autocast || weight.dtype() == x.dtype())) {
    return fused_linear(x, weight, bias, compute);
  }
  // Fold leading dims into one GEMM.
  Shape out_shape = x.shape();
  out_shape.back() = weight.size(0);
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor y = matmul(reshape(x, {rows, x.size(-1)}), transpose(weight, 0, 1));
  if (bias.defined()) y = add(y, autocast_cast(bias, AutocastCategory::kLowerPrecision));
  return reshape(y, out_shape);
}

}  // namespace tessel
