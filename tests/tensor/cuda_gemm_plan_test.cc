// How the CUDA matmul maps products onto cuBLASLt's column-major GEMM
// (tensor/cuda/cuda_gemm_plan.h), checked on the CPU: each plan is executed by a column-major
// reference GEMM that reads the operands' memory exactly as cuBLASLt would (op, leading dim,
// batch strides), and compared with the CPU backend's matmul, over random shapes, row- and
// column-major operands, sliced rows, broadcast and permuted batch dims.
#include "tessel/tensor/cuda/cuda_gemm_plan.h"

#include <gtest/gtest.h>

#include <random>

#include "tessel/base/error.h"
#include "tessel/tensor/backend.h"
#include "tessel/tensor/ops.h"

namespace tessel::cuda {
namespace {

// The element (row, col) of a column-major layout, op applied.
float at(const float* base, const GemmOperand& o, int64_t row, int64_t col) {
  return o.transpose ? base[col + row * o.ld] : base[row + col * o.ld];
}

// Runs the plan of out = a @ b as cuBLASLt would, checking every read stays in its storage.
void run_plan(const Tensor& a, const Tensor& b, const Tensor& out, int depth = 0) {
  const GemmPlan p = plan_gemm(a, b, out);
  if (p.dense) {
    ASSERT_EQ(depth, 0) << "a dense copy must plan as one call";
    auto dense = [&](const Tensor& t) { return contiguous(batch_expanded(t, out)); };
    run_plan(dense(a), dense(b), out, depth + 1);
    return;
  }
  // op(A) is m x k, op(B) k x n, and each layout's leading dim covers its rows.
  EXPECT_EQ(p.A.transpose ? p.A.cols : p.A.rows, p.m);
  EXPECT_EQ(p.A.transpose ? p.A.rows : p.A.cols, p.k);
  EXPECT_EQ(p.B.transpose ? p.B.cols : p.B.rows, p.k);
  EXPECT_EQ(p.B.transpose ? p.B.rows : p.B.cols, p.n);
  EXPECT_GE(p.A.ld, p.A.rows);
  EXPECT_GE(p.B.ld, p.B.rows);
  EXPECT_EQ(p.m * p.n * p.batch, out.numel());
  const float* A = b.data<float>();  // cuBLASLt's A is our b
  const float* B = a.data<float>();
  float* D = out.data<float>();
  auto in_storage = [](const Tensor& t, const float* p) {
    const float* begin = static_cast<const float*>(t.storage().data());
    return p >= begin && p < begin + t.storage().bytes() / sizeof(float);
  };
  for (int64_t i = 0; i < p.batch; ++i) {
    for (int64_t r = 0; r < p.m; ++r) {
      for (int64_t c = 0; c < p.n; ++c) {
        double sum = 0;
        for (int64_t k = 0; k < p.k; ++k) {
          const float* pa = A + i * p.stride_a;
          const float* pb = B + i * p.stride_b;
          ASSERT_TRUE(in_storage(b, &pa[p.A.transpose ? k + r * p.A.ld : r + k * p.A.ld]));
          ASSERT_TRUE(in_storage(a, &pb[p.B.transpose ? c + k * p.B.ld : k + c * p.B.ld]));
          sum += static_cast<double>(at(pa, p.A, r, k)) * at(pb, p.B, k, c);
        }
        D[i * p.stride_d + r + c * p.ldd] = static_cast<float>(sum);
      }
    }
  }
}

// A [..., R, C] operand over fresh memory: row- or column-major in its last two dims, rows
// possibly spaced out, batch dims in a random memory order or broadcast (size 1).
Tensor random_operand(std::mt19937_64& rng, Shape shape, std::vector<bool> broadcast) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  for (int64_t d = 0; d < rank - 2; ++d) {
    if (broadcast[d]) shape[d] = 1;
  }
  // Physical order: batch dims shuffled, then the matrix dims in row- or column-major order.
  std::vector<int64_t> order;
  for (int64_t d = 0; d < rank - 2; ++d) order.push_back(d);
  std::shuffle(order.begin(), order.end(), rng);
  const bool col_major = rng() % 2 == 0;
  order.push_back(col_major ? rank - 1 : rank - 2);
  order.push_back(col_major ? rank - 2 : rank - 1);
  Strides strides(rank);
  int64_t running = 1;
  for (int64_t k = rank - 1; k >= 0; --k) {
    const int64_t d = order[k];
    strides[d] = running;
    running *= shape[d] + (k == rank - 2 && rng() % 3 == 0 ? 2 : 0);  // gaps between rows
  }
  const Tensor base = randn({running + 4});
  return base.as_strided(shape, strides, 2);
}

TEST(CudaGemmPlanTest, PlansComputeTheProductForRandomLayouts) {
  std::mt19937_64 rng(17);
  int dense_plans = 0, folded = 0;
  for (int it = 0; it < 400; ++it) {
    const int64_t rank = 2 + static_cast<int64_t>(rng() % 3);
    const int64_t M = 1 + rng() % 6, K = 1 + rng() % 6, N = 1 + rng() % 6;
    Shape batch;
    for (int64_t d = 0; d < rank - 2; ++d) batch.push_back(1 + rng() % 3);
    std::vector<bool> bcast_a(rank, false), bcast_b(rank, false);
    for (int64_t d = 0; d < rank - 2; ++d) {
      bcast_a[d] = rng() % 4 == 0;
      bcast_b[d] = !bcast_a[d] && rng() % 3 == 0;
    }
    Shape sa = batch, sb = batch, so = batch;
    sa.insert(sa.end(), {M, K});
    sb.insert(sb.end(), {K, N});
    so.insert(so.end(), {M, N});
    const Tensor a = random_operand(rng, sa, bcast_a);
    const Tensor b = random_operand(rng, sb, bcast_b);
    const Tensor got = zeros(so), want = zeros(so);
    const GemmPlan p = plan_gemm(a, b, got);
    dense_plans += p.dense;
    folded += !p.dense && rank > 2 && p.batch == 1 && p.n > M;
    run_plan(a, b, got);
    backend_for(Device::cpu()).matmul(a, b, want);
    const std::vector<float> g = to_vector<float>(got), w = to_vector<float>(want);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_NEAR(g[i], w[i], 1e-4 * (1 + std::fabs(w[i])))
          << "iteration " << it << " a " << shape_str(a.shape()) << " strides "
          << shape_str(a.strides()) << ", b " << shape_str(b.shape()) << " strides "
          << shape_str(b.strides()) << ", element " << i;
    }
  }
  EXPECT_GT(dense_plans, 10);  // the sweep reaches every path
  EXPECT_GT(folded, 5);
}

TEST(CudaGemmPlanTest, OperandsThatAreNeitherRowNorColumnMajorAreRefused) {
  EXPECT_THROW(transposed_operand(3, 4, 8, 2), Internal);
  const GemmOperand row = transposed_operand(3, 4, 4, 1);
  EXPECT_FALSE(row.transpose);
  EXPECT_EQ(row.ld, 4);
  const GemmOperand col = transposed_operand(3, 4, 1, 3);
  EXPECT_TRUE(col.transpose);
  EXPECT_EQ(col.ld, 3);
  const GemmOperand vector = transposed_operand(1, 5, 0, 1);  // one row: any row stride
  EXPECT_EQ(vector.ld, 5);
}

}  // namespace
}  // namespace tessel::cuda
