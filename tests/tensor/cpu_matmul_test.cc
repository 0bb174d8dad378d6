// CPU matmul split across the thread pool: row (or batch) chunks of equal shape run at the same
// time on different threads. Each product is repeated many times at several thread counts and
// checked against plain loops, so a chunk that reads or writes another chunk's data shows up.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tessel/tensor/ops.h"
#include "tessel/tensor/random.h"
#include "tessel/tensor/thread_pool.h"

namespace tessel {
namespace {

// Restores the pool's thread count when a test ends, also when an assertion fails.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : before_(num_threads()) {}
  ~ThreadCountGuard() { set_num_threads(before_); }

 private:
  int before_;
};

// a [batch, m, k] (batch 1 for 2-D) times the transpose of w [n, k], in double.
std::vector<double> product_by_loops(const Tensor& a, const Tensor& w) {
  const std::vector<float> va = to_vector<float>(a), vw = to_vector<float>(w);
  const int64_t k = a.size(-1), n = w.size(0), rows = a.numel() / k;
  std::vector<double> out(static_cast<size_t>(rows * n));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < k; ++q) acc += double{va[i * k + q]} * vw[j * k + q];
      out[i * n + j] = acc;
    }
  return out;
}

struct Case {
  Shape a;  // [m, k] or [batch, m, k]
  Shape w;  // [n, k]; the product uses its transposed view, as linear() does
};

// Every chunk of these shapes has the shape of another chunk at 2, 3, 4 and 8 threads (64 and
// 1024 rows split into chunks of at least 32 rows; 12 batches split evenly), and the 1024-row
// product and its operands span whole blocks of the allocator cache (>= 1 MiB).
const std::vector<Case> kCases = {
    {{64, 32}, {16, 32}}, {{1024, 256}, {256, 256}}, {{12, 48, 40}, {24, 40}}};

TEST(CpuMatmulTest, EqualChunksMatchLoopsAtEveryThreadCount) {
  ThreadCountGuard guard;
  Generator gen(21);
  for (const Case& c : kCases) {
    const Tensor a = randn(c.a, gen), w = randn(c.w, gen);
    const std::vector<double> expected = product_by_loops(a, w);
    for (int threads : {2, 3, 4, 8}) {
      set_num_threads(threads);
      for (int rep = 0; rep < 100; ++rep) {
        const std::vector<float> got = to_vector<float>(matmul(a, transpose(w, 0, 1)));
        ASSERT_EQ(got.size(), expected.size());
        for (size_t i = 0; i < got.size(); ++i) {
          // Sums of k products of unit normals: f32 rounding stays far below 1e-4 * k.
          ASSERT_NEAR(got[i], expected[i], 1e-4 * static_cast<double>(c.a.back()))
              << shape_str(c.a) << " x " << shape_str(c.w) << "^T, threads " << threads
              << ", repetition " << rep << ", element " << i;
        }
      }
    }
  }
}

// Products with the same layout share one cached primitive, whose operand addresses change
// per call: alternating between different tensors of one shape (f32 and bf16, 2-D and batched
// with a broadcast batch dim, split across threads or not) must give each pair its own product.
TEST(CpuMatmulTest, CachedPrimitivesTakeEachCallsOperands) {
  ThreadCountGuard guard;
  Generator gen(5);
  const std::vector<Case> cases = {{{96, 40}, {24, 40}}, {{3, 70, 20}, {12, 20}}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Case& c : cases) {
      Tensor a[2], w[2];
      std::vector<double> expected[2];
      for (int i = 0; i < 2; ++i) {
        // Round to the dtype first, so the loops see the values the product sees.
        a[i] = to(to(randn(c.a, gen), dtype), DType::kF32);
        w[i] = to(to(randn(c.w, gen), dtype), DType::kF32);
        expected[i] = product_by_loops(a[i], w[i]);
      }
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        for (int rep = 0; rep < 6; ++rep) {
          const int i = rep % 2;
          const Tensor got =
              to(matmul(to(a[i], dtype), transpose(to(w[i], dtype), 0, 1)), DType::kF32);
          const std::vector<float> values = to_vector<float>(got);
          ASSERT_EQ(values.size(), expected[i].size());
          // bf16 output: 8 bits of mantissa on sums of up to 40 products of unit normals.
          const double tol = dtype == DType::kF32 ? 1e-3 : 0.1;
          for (size_t e = 0; e < values.size(); ++e) {
            ASSERT_NEAR(values[e], expected[i][e], tol * (1 + std::abs(expected[i][e])))
                << dtype_name(dtype) << " " << shape_str(c.a) << ", operands " << i << ", threads "
                << threads << ", element " << e;
          }
        }
      }
    }
  }
}

// A batch-broadcast operand (size 1 on the batch dim the kernel splits across threads) is used
// whole by every chunk. Taking it as a narrow of a larger tensor, a chunk that indexed past its
// size-1 dim would read the next batch's data instead of failing (found by
// backend_conformance_test; the fresh-tensor case threw OutOfRange).
TEST(CpuMatmulTest, BroadcastBatchOperandSplitAcrossThreads) {
  ThreadCountGuard guard;
  Generator gen(22);
  const Tensor big = randn({3, 4, 5}, gen), b = randn({3, 5, 6}, gen);
  for (const Tensor& a : {narrow(big, 0, 0, 1), contiguous(narrow(big, 0, 0, 1))}) {
    const std::vector<float> va = to_vector<float>(a), vb = to_vector<float>(b);
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      const std::vector<float> got = to_vector<float>(matmul(a, b));  // [3, 4, 6]
      ASSERT_EQ(got.size(), 72u);
      for (int64_t batch = 0; batch < 3; ++batch)
        for (int64_t i = 0; i < 4; ++i)
          for (int64_t j = 0; j < 6; ++j) {
            double acc = 0;
            for (int64_t q = 0; q < 5; ++q)
              acc += double{va[i * 5 + q]} * vb[(batch * 5 + q) * 6 + j];
            ASSERT_NEAR(got[(batch * 4 + i) * 6 + j], acc, 1e-5)
                << "threads " << threads << ", batch " << batch << ", row " << i << ", col " << j;
          }
    }
  }
}

}  // namespace
}  // namespace tessel
