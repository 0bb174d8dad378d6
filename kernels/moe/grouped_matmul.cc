#include "tessel/kernels/moe/grouped_matmul.h"

#include "tessel/base/error.h"
#include "tessel/kernels/moe/cuda/grouped_matmul_cuda.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::kernels {
namespace {

void check_grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  TESSEL_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(1), InvalidArgument,
               "grouped_matmul expects x (M, K) and w (G, K, N), got x {} and w {}",
               shape_str(x.shape()), shape_str(w.shape()));
  TESSEL_CHECK(x.dtype() == w.dtype() && is_floating(x.dtype()), InvalidArgument,
               "grouped_matmul expects x and w of one floating dtype, got {} and {}", x.str(),
               w.str());
  const int64_t G = w.size(0), M = x.size(0);
  TESSEL_CHECK(static_cast<int64_t>(offsets.size()) == G + 1, InvalidArgument,
               "grouped_matmul: {} groups need {} offsets, got {}", G, G + 1, offsets.size());
  TESSEL_CHECK(offsets.front() == 0 && offsets.back() == M, InvalidArgument,
               "grouped_matmul: offsets must run from 0 to the {} rows of x, got {} .. {}", M,
               offsets.front(), offsets.back());
  for (int64_t g = 0; g < G; ++g) {
    TESSEL_CHECK(offsets[g] <= offsets[g + 1], InvalidArgument,
                 "grouped_matmul: offsets must not decrease, got {} then {} at group {}",
                 offsets[g], offsets[g + 1], g);
  }
}

// out_g = a_g @ b(g) for each group's rows of a; `b` gives the group's (K, N) operand.
template <typename B>
void run_groups(const Tensor& a, const std::vector<int64_t>& offsets, const Tensor& out,
                const B& b) {
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    copy_(narrow(out, 0, offsets[g], rows), matmul(narrow(a, 0, offsets[g], rows), b(g)));
  }
}

// CUDA tensors in a build with the kernel take it (one launch per product).
bool use_cuda_kernel(const Tensor& x) {
  return x.device().is_cuda() && grouped_matmul_cuda_is_available();
}

}  // namespace

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets) {
  check_grouped_matmul(x, w, offsets);
  auto forward = [offsets](FunctionContext& ctx, const std::vector<Tensor>& in) {
    const Tensor& a = in[0];
    const Tensor& b = in[1];
    if (use_cuda_kernel(a)) {
      const Tensor ac = contiguous(a), bc = contiguous(b);
      const Tensor offs = to(from_vector<int64_t>(offsets), a.device());
      Tensor out = empty({a.size(0), b.size(2)}, a.dtype(), a.device());
      grouped_matmul_cuda(ac, bc, offs, /*transpose_w=*/false, out);
      ctx.save_for_backward({ac, bc, offs});
      return std::vector<Tensor>{out};
    }
    Tensor out = zeros({a.size(0), b.size(2)}, a.dtype(), a.device());
    run_groups(a, offsets, out, [&](size_t g) { return select(b, 0, static_cast<int64_t>(g)); });
    ctx.save_for_backward({a, b});
    return std::vector<Tensor>{out};
  };
  auto backward = [offsets](FunctionContext& ctx, const std::vector<Tensor>& grad) {
    const Tensor& a = ctx.saved_tensors()[0];
    const Tensor& b = ctx.saved_tensors()[1];
    const Tensor dy = contiguous(grad[0]);
    Tensor dx, dw;
    if (use_cuda_kernel(a)) {
      const Tensor& offs = ctx.saved_tensors()[2];
      if (ctx.needs_input_grad(0)) {
        dx = empty(a.shape(), a.dtype(), a.device());
        grouped_matmul_cuda(dy, b, offs, /*transpose_w=*/true, dx);
      }
      if (ctx.needs_input_grad(1)) {
        dw = empty(b.shape(), b.dtype(), b.device());
        grouped_matmul_cuda_weight_grad(a, dy, offs, dw);
      }
      return std::vector<Tensor>{dx, dw};
    }
    if (ctx.needs_input_grad(0)) {
      dx = zeros(a.shape(), a.dtype(), a.device());
      run_groups(dy, offsets, dx,
                 [&](size_t g) { return transpose(select(b, 0, static_cast<int64_t>(g)), 0, 1); });
    }
    if (ctx.needs_input_grad(1)) {
      dw = zeros(b.shape(), b.dtype(), b.device());
      for (size_t g = 0; g + 1 < offsets.size(); ++g) {
        const int64_t rows = offsets[g + 1] - offsets[g];
        if (rows == 0) continue;
        copy_(select(dw, 0, static_cast<int64_t>(g)),
              matmul(transpose(narrow(a, 0, offsets[g], rows), 0, 1),
                     narrow(dy, 0, offsets[g], rows)));
      }
    }
    return std::vector<Tensor>{dx, dw};
  };
  return apply_function("grouped_matmul", {x, w}, forward, backward)[0];
}

}  // namespace tessel::kernels
