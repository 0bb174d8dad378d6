// Backend conformance cases for the mixture of experts' grouped matmul (kernels/moe/): forward
// and both gradients through autograd, whose device picks the CPU path (a GEMM per group) or the
// CUDA kernel (kernels/moe/cuda/). Problems: group sizes from a random routing with empty groups
// and, in iteration 0, no rows at all; references in double precision with the matmul's error
// scale (the sum of the terms' magnitudes, times the length plus 4 roundings).

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend_conformance.h"
#include "tessel/kernels/moe/grouped_matmul.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"

namespace tessel::testing {
namespace {

// Offsets of G groups over M rows: random sizes, some groups empty.
std::vector<int64_t> group_offsets(Rng& rng, int64_t groups, int64_t rows) {
  std::vector<int64_t> cuts(static_cast<size_t>(groups - 1));
  for (int64_t& c : cuts) c = uniform_int(rng, 0, rows);
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> offsets = {0};
  offsets.insert(offsets.end(), cuts.begin(), cuts.end());
  offsets.push_back(rows);
  return offsets;
}

// sum over q < len of a(q) * b(q), with the error scale of a length-len dot product.
template <typename A, typename B>
void dot(int64_t len, const A& a, const B& b, Expected& e) {
  double acc = 0, scale = 0;
  for (int64_t q = 0; q < len; ++q) {
    const double term = a(q) * b(q);
    acc += term;
    scale += std::fabs(term);
  }
  e.value.push_back(acc);
  e.scale.push_back(scale * (static_cast<double>(len) + 4));
}

int64_t group_of(const std::vector<int64_t>& offsets, int64_t m) {
  int64_t g = 0;
  while (offsets[g + 1] <= m) ++g;
  return g;
}

}  // namespace

KernelCase grouped_matmul_case(bool backward) {
  return {backward ? "grouped_matmul_backward" : "grouped_matmul",
          [backward](Rng& rng, int it) {
            const DType dtype = pick(it, {DType::kF32, DType::kBF16});  // the CPU GEMM's dtypes
            const int64_t G = uniform_int(rng, 1, 9), M = it == 0 ? 0 : uniform_int(rng, 1, 70);
            const int64_t K = uniform_int(rng, 1, 40), N = uniform_int(rng, 1, 40);
            Problem p;
            p.in.push_back(contiguous_input(rng, {M, K}, dtype, normal_values(1)));
            p.in.push_back(contiguous_input(rng, {G, K, N}, dtype, normal_values(1)));
            if (backward) p.in.push_back(contiguous_input(rng, {M, N}, dtype, normal_values(1)));
            p.ints = group_offsets(rng, G, M);
            if (!backward) p.out.push_back(output(rng, {M, N}, dtype));
            if (backward) {
              p.out.push_back(output(rng, {M, K}, dtype));
              p.out.push_back(output(rng, {G, K, N}, dtype));
            }
            return p;
          },
          [backward](Backend&, const Problem& p) {
            if (!backward) {
              copy_(p.out[0], kernels::grouped_matmul(p.in[0], p.in[1], p.ints));
              return;
            }
            Tensor x = detach(p.in[0]), w = detach(p.in[1]);
            x.set_requires_grad(true);
            w.set_requires_grad(true);
            tessel::backward(kernels::grouped_matmul(x, w, p.ints), p.in[2]);
            copy_(p.out[0], x.grad());
            copy_(p.out[1], w.grad());
          },
          [backward](const Problem& p) {
            const std::vector<double> x = read_all(p.in[0]), w = read_all(p.in[1]);
            const int64_t M = p.in[0].size(0), K = p.in[1].size(1), N = p.in[1].size(2);
            const int64_t G = p.in[1].size(0);
            const std::vector<int64_t>& off = p.ints;
            if (!backward) {
              Expected y;
              for (int64_t m = 0; m < M; ++m) {
                const int64_t g = group_of(off, m);
                for (int64_t n = 0; n < N; ++n) {
                  dot(
                      K, [&](int64_t k) { return x[m * K + k]; },
                      [&](int64_t k) { return w[(g * K + k) * N + n]; }, y);
                }
              }
              return std::vector<Expected>{y};
            }
            const std::vector<double> dy = read_all(p.in[2]);
            Expected dx, dw;
            for (int64_t m = 0; m < M; ++m) {
              const int64_t g = group_of(off, m);
              for (int64_t k = 0; k < K; ++k) {
                dot(
                    N, [&](int64_t n) { return dy[m * N + n]; },
                    [&](int64_t n) { return w[(g * K + k) * N + n]; }, dx);
              }
            }
            for (int64_t g = 0; g < G; ++g) {
              for (int64_t k = 0; k < K; ++k) {
                for (int64_t n = 0; n < N; ++n) {
                  dot(
                      off[g + 1] - off[g], [&](int64_t r) { return x[(off[g] + r) * K + k]; },
                      [&](int64_t r) { return dy[(off[g] + r) * N + n]; }, dw);
                }
              }
            }
            return std::vector<Expected>{dx, dw};
          },
          kEps};
}

}  // namespace tessel::testing
