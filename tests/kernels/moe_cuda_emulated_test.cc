// The CUDA grouped matmul's per-element bodies (kernels/moe/cuda/internal/
// grouped_matmul_cuda_params.h) run on the CPU over every work item, as the grid-stride loop
// hands them out: forward, input gradient (the transposed weight) and weight gradient equal the
// CPU grouped_matmul (f32, relative 1e-5: the CPU GEMM sums in another order), with empty groups,
// an empty first and last group, and a grid smaller than the work (threads stride).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessel/kernels/moe/cuda/internal/grouped_matmul_cuda_params.h"
#include "tessel/kernels/moe/grouped_matmul.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/random.h"

namespace tessel::kernels::cuda {
namespace {

// Runs body(i) for every item < n the way a grid of `blocks` blocks would.
template <typename Body>
void emulate(int64_t n, int64_t blocks, const Body& body) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t t = 0; t < kLlamaThreads; ++t) llama_grid_stride(n, b, blocks, t, body);
  }
}

void expect_close(const std::vector<float>& got, const Tensor& want, const char* what) {
  const std::vector<float> w = to_vector<float>(contiguous(want));
  ASSERT_EQ(got.size(), w.size()) << what;
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_NEAR(got[i], w[i], 1e-5 * (1 + std::fabs(w[i]))) << what << " element " << i;
  }
}

TEST(MoeCudaEmulatedTest, BodiesMatchTheCpuGroupedMatmul) {
  const int64_t K = 7, N = 5;
  const std::vector<int64_t> offsets = {0, 0, 3, 3, 9, 10, 10};  // 6 groups, 3 of them empty
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  Generator gen(4);
  Tensor x = randn({M, K}, gen), w = randn({G, K, N}, gen), dy = randn({M, N}, gen);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor y = grouped_matmul(x, w, offsets);
  backward(y, dy);

  const std::vector<float> xs = to_vector<float>(detach(x)), ws = to_vector<float>(detach(w)),
                           dys = to_vector<float>(dy);
  for (int64_t blocks : {int64_t{1}, llama_blocks(M * N)}) {
    std::vector<float> out(static_cast<size_t>(M * N), NAN);
    GroupedMatmulParams p{.a = xs.data(),
                          .b = ws.data(),
                          .out = out.data(),
                          .offsets = offsets.data(),
                          .groups = G,
                          .rows = M,
                          .inner = K,
                          .cols = N,
                          .b_group = K * N,
                          .b_inner = N,
                          .b_col = 1};
    emulate(M * N, blocks, [&](int64_t i) { grouped_matmul_at<LlamaElem::kF32>(p, i); });
    expect_close(out, y, "forward");

    std::vector<float> dx(static_cast<size_t>(M * K), NAN);
    GroupedMatmulParams q{.a = dys.data(),
                          .b = ws.data(),
                          .out = dx.data(),
                          .offsets = offsets.data(),
                          .groups = G,
                          .rows = M,
                          .inner = N,
                          .cols = K,
                          .b_group = K * N,
                          .b_inner = 1,
                          .b_col = N};
    emulate(M * K, blocks, [&](int64_t i) { grouped_matmul_at<LlamaElem::kF32>(q, i); });
    expect_close(dx, x.grad(), "input gradient");

    std::vector<float> dw(static_cast<size_t>(G * K * N), NAN);
    GroupedWeightGradParams r{.x = xs.data(),
                              .dy = dys.data(),
                              .dw = dw.data(),
                              .offsets = offsets.data(),
                              .groups = G,
                              .inner = K,
                              .cols = N};
    emulate(G * K * N, blocks, [&](int64_t i) { grouped_weight_grad_at<LlamaElem::kF32>(r, i); });
    expect_close(dw, w.grad(), "weight gradient");
  }
}

TEST(MoeCudaEmulatedTest, GroupOfRowSkipsEmptyGroups) {
  const std::vector<int64_t> offsets = {0, 0, 3, 3, 9, 10, 10};
  const std::vector<int64_t> want = {1, 1, 1, 3, 3, 3, 3, 3, 3, 4};
  for (int64_t m = 0; m < 10; ++m) {
    EXPECT_EQ(group_of_row(offsets.data(), 6, m), want[m]) << "row " << m;
  }
}

}  // namespace
}  // namespace tessel::kernels::cuda
