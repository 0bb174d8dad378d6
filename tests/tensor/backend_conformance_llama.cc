// Backend conformance cases for Llama's fused kernels of kernels/llama/ (RoPE and SwiGLU, each
// forward and backward): problems, the kernel calls and double-precision references (see
// backend_conformance_test.cc for the rules). These kernels are not Backend methods: a case
// calls rope() or swiglu() on the problem's tensors, whose device picks the fused CPU or CUDA
// kernel, and the backward cases run them through autograd.

#include <cmath>
#include <string>
#include <vector>

#include "backend_conformance.h"
#include "tessel/kernels/llama/rope.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

// x (B, T, H, D) with D even: odd and larger-than-a-block sizes, an empty batch in iteration 0
// and about 1 in 8 problems past the kernels' parallel grains (and several CUDA blocks).
Shape rope_shape(Rng& rng, int it) {
  static const int64_t kHeadDims[] = {2, 4, 6, 16, 34, 64, 128};
  Shape s = {uniform_int(rng, 1, 3), uniform_int(rng, 1, 17), uniform_int(rng, 1, 5),
             kHeadDims[uniform_int(rng, 0, 6)]};
  if (it == 0) s[0] = 0;
  if (it % 8 == 5) s[1] = 70000 / (s[0] * s[2] * s[3]) + 1;
  return s;
}

// The rotation of pair i of each head by (cos, sign * sin): value and error scale.
std::vector<Expected> rope_reference(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                     double sign) {
  const std::vector<double> xv = read_all(x), cv = read_all(cos), sv = read_all(sin);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), half = x.size(3) / 2;
  const bool batched = cos.dim() == 3;
  Expected e;
  e.value.resize(xv.size());
  e.scale.resize(xv.size());
  for (int64_t row = 0; row < B * T; ++row) {
    const int64_t table = (batched ? row : row % T) * half;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = (row * H + h) * 2 * half;
      for (int64_t i = 0; i < half; ++i) {
        const double x1 = xv[at + i], x2 = xv[at + i + half];
        const double c = cv[table + i], s = sign * sv[table + i];
        // Two products and a sum, each rounded in f32.
        e.value[at + i] = x1 * c - x2 * s;
        e.scale[at + i] = 2 * (mag(x1 * c) + mag(x2 * s));
        e.value[at + i + half] = x2 * c + x1 * s;
        e.scale[at + i + half] = 2 * (mag(x2 * c) + mag(x1 * s));
      }
    }
  }
  return {e};
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

KernelCase rope_case(bool backward) {
  return {backward ? "rope_backward" : "rope",
          [backward](Rng& rng, int it) {
            const DType dtype = pick(it, kFloatDTypes);
            const Shape shape = rope_shape(rng, it);
            const bool batched = coin(rng, 0.5);
            Shape table = {shape[1], shape[3] / 2};
            if (batched) table.insert(table.begin(), shape[0]);
            Problem p;
            // Backward: x is a leaf (contiguous), the output gradient any layout.
            p.in.push_back(random_view(rng, shape, dtype, backward ? kContiguous : kAnyLayout,
                                       normal_values(2)));
            p.in.push_back(random_view(rng, table, DType::kF32, kAnyLayout, uniform_values(-1, 1)));
            p.in.push_back(random_view(rng, table, DType::kF32, kAnyLayout, uniform_values(-1, 1)));
            if (backward) p.in.push_back(random_view(rng, shape, dtype, kAnyLayout));
            p.out.push_back(output(rng, shape, dtype));
            return p;
          },
          [backward](Backend&, const Problem& p) {
            if (!backward) {
              copy_(p.out[0], kernels::rope(p.in[0], p.in[1], p.in[2]));
              return;
            }
            Tensor x = detach(p.in[0]);
            x.set_requires_grad(true);
            tessel::backward(kernels::rope(x, p.in[1], p.in[2]), p.in[3]);
            copy_(p.out[0], x.grad());
          },
          [backward](const Problem& p) {
            // The gradient of the rotation is the inverse rotation of the output gradient.
            return backward ? rope_reference(p.in[3], p.in[1], p.in[2], -1.0)
                            : rope_reference(p.in[0], p.in[1], p.in[2], 1.0);
          },
          kEps};
}

KernelCase swiglu_case(bool backward) {
  return {
      backward ? "swiglu_backward" : "swiglu",
      [backward](Rng& rng, int it) {
        const DType dtype = pick(it, kFloatDTypes);
        Shape shape = random_shape(rng, 1, 4);
        if (it == 0) shape = {0, 3};
        const Layout layout = backward ? kContiguous : kAnyLayout;  // leaves: contiguous
        Problem p;
        p.in.push_back(random_view(rng, shape, dtype, layout, normal_values(3)));
        p.in.push_back(random_view(rng, shape, dtype, layout, normal_values(2)));
        if (backward) p.in.push_back(random_view(rng, shape, dtype, kAnyLayout));
        p.out.push_back(output(rng, shape, dtype));
        if (backward) p.out.push_back(output(rng, shape, dtype));
        return p;
      },
      [backward](Backend&, const Problem& p) {
        if (!backward) {
          copy_(p.out[0], kernels::swiglu(p.in[0], p.in[1]));
          return;
        }
        Tensor gate = detach(p.in[0]), up = detach(p.in[1]);
        gate.set_requires_grad(true);
        up.set_requires_grad(true);
        tessel::backward(kernels::swiglu(gate, up), p.in[2]);
        copy_(p.out[0], gate.grad());
        copy_(p.out[1], up.grad());
      },
      [backward](const Problem& p) {
        const std::vector<double> g = read_all(p.in[0]), u = read_all(p.in[1]);
        const std::vector<double> dy =
            backward ? read_all(p.in[2]) : std::vector<double>(g.size(), 1.0);
        Expected out, grad_gate, grad_up;
        for (size_t i = 0; i < g.size(); ++i) {
          const double s = sigmoid(g[i]);
          if (!backward) {
            // The sigmoid to a few ulp (the CPU's fast exp), then two products.
            out.value.push_back(g[i] * s * u[i]);
            out.scale.push_back(16 * mag(g[i] * s * u[i]));
            continue;
          }
          const double inner = 1 + g[i] * (1 - s);
          const double outer = dy[i] * u[i] * s;
          grad_gate.value.push_back(outer * inner);
          // 1 - s loses its relative accuracy as s nears 1: an absolute error in units of
          // |g| that the sum with 1 can make as large as the result.
          grad_gate.scale.push_back(mag(outer) * (16 * mag(inner) + 16 * mag(g[i]) + 16));
          grad_up.value.push_back(dy[i] * g[i] * s);
          grad_up.scale.push_back(16 * mag(dy[i] * g[i] * s));
        }
        return backward ? std::vector<Expected>{grad_gate, grad_up} : std::vector<Expected>{out};
      },
      kEps};
}

}  // namespace tessel::testing
