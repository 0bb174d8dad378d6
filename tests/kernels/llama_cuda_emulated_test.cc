// The CUDA kernels of Llama's RoPE and SwiGLU (kernels/llama/cuda/) run on the CPU: their
// per-thread bodies through the kernels' own grid-stride loop, every block and thread of the
// launch in turn, against the fused CPU kernels. This checks the indexing (every item written
// once, for empty sizes, sizes off the block size and grids smaller than the work), the element
// conversions and the arithmetic, without a GPU; backend_conformance_test runs the kernels
// themselves on a device.
//
// The kernel files are included here as C++: their bodies are host-and-device functions, and
// their __global__ kernels and launchers are compiled only by nvcc.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tessel/kernels/llama/cuda/rope_cuda.cu"
#include "tessel/kernels/llama/cuda/swiglu_cuda.cu"
#include "tessel/kernels/llama/rope.h"
#include "tessel/kernels/llama/swiglu.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/random.h"

namespace tessel::kernels::cuda {
namespace {

// Runs body(item) as the launch would: `blocks` blocks (default: the launchers' count) of
// kLlamaThreads threads, each through llama_grid_stride.
template <typename Body>
void emulate_launch(int64_t n, Body&& body, int64_t blocks = -1) {
  if (blocks < 0) blocks = llama_blocks(n);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t t = 0; t < kLlamaThreads; ++t) llama_grid_stride(n, b, blocks, t, body);
  }
}

LlamaElem elem_of(DType dtype) {
  return dtype == DType::kF32 ? LlamaElem::kF32
                              : (dtype == DType::kBF16 ? LlamaElem::kBf16 : LlamaElem::kF16);
}

template <typename Fn>
void with_elem(LlamaElem e, Fn&& fn) {
  switch (e) {
    case LlamaElem::kF32:
      return fn(std::integral_constant<LlamaElem, LlamaElem::kF32>{});
    case LlamaElem::kBf16:
      return fn(std::integral_constant<LlamaElem, LlamaElem::kBf16>{});
    case LlamaElem::kF16:
      return fn(std::integral_constant<LlamaElem, LlamaElem::kF16>{});
  }
}

Tensor random_input(const Shape& shape, DType dtype, double scale, uint64_t seed) {
  Generator gen(seed);
  return to(mul(randn(shape, gen, DType::kF32, Device::cpu()), scalar_tensor(scale)), dtype);
}

// |got - want| <= rtol |want| + atol elementwise (both read as f32).
void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol) {
  const std::vector<float> g = to_vector<float>(to(got, DType::kF32));
  const std::vector<float> w = to_vector<float>(to(want, DType::kF32));
  ASSERT_EQ(g.size(), w.size());
  int reported = 0;
  for (size_t i = 0; i < g.size() && reported < 4; ++i) {
    if (std::fabs(g[i] - w[i]) <= rtol * std::fabs(w[i]) + atol) continue;
    ADD_FAILURE() << "element " << i << " is " << g[i] << ", expected " << w[i];
    ++reported;
  }
}

TEST(LlamaCudaGridTest, EveryItemOnce_AnySizeAndGrid) {
  EXPECT_EQ(llama_blocks(0), 0);
  EXPECT_EQ(llama_blocks(-1), 0);
  EXPECT_EQ(llama_blocks(1), 1);
  EXPECT_EQ(llama_blocks(kLlamaThreads), 1);
  EXPECT_EQ(llama_blocks(kLlamaThreads + 1), 2);
  EXPECT_EQ(llama_blocks(int64_t{1} << 40), kLlamaMaxBlocks);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{1000},
                    kLlamaMaxBlocks * kLlamaThreads + 3}) {
    for (int64_t blocks : {int64_t{-1}, int64_t{1}, int64_t{3}}) {
      if (n > 100000 && blocks > 0) continue;  // the full grid is enough there
      std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
      emulate_launch(
          n, [&](int64_t i) { ++seen[static_cast<size_t>(i)]; }, blocks);
      int64_t wrong = 0;
      for (uint8_t s : seen) wrong += s != 1;
      EXPECT_EQ(wrong, 0) << "n " << n << " blocks " << blocks;
    }
  }
}

struct RopeShape {
  int64_t B, T, H, D;
};

TEST(LlamaCudaEmulatedTest, RopeMatchesCpuKernel_ForwardAndInverse) {
  const RopeShape shapes[] = {
      {0, 3, 2, 8}, {1, 1, 1, 2}, {2, 5, 3, 16}, {3, 7, 2, 34}, {1, 33, 4, 64}};
  uint64_t seed = 1;
  for (const RopeShape& s : shapes) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool batched : {false, true}) {
        for (float sign : {1.0f, -1.0f}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " (" << s.B << ", " << s.T << ", " << s.H << ", "
                       << s.D << ") batched " << batched << " sign " << sign);
          const Tensor x = random_input({s.B, s.T, s.H, s.D}, dtype, 2.0, seed++);
          Shape table = {s.T, s.D / 2};
          if (batched) table.insert(table.begin(), s.B);
          const Tensor cos = random_input(table, DType::kF32, 1.0, seed++);
          const Tensor sin = random_input(table, DType::kF32, 1.0, seed++);
          Tensor out = zeros(x.shape(), dtype, Device::cpu());
          RopeParams p;
          p.x = x.data_ptr();
          p.out = out.data_ptr();
          p.cos = cos.data<float>();
          p.sin = sin.data<float>();
          p.rows = s.B * s.T;
          p.seq = s.T;
          p.heads = s.H;
          p.half = s.D / 2;
          p.sign = sign;
          p.batched_tables = batched;
          with_elem(elem_of(dtype), [&](auto e) {
            emulate_launch(p.pairs(),
                           [&](int64_t item) { rope_pair<decltype(e)::value>(p, item); });
          });
          // The same operations in the same order as the CPU kernel: equal bit for bit.
          const Tensor want = rope(x, cos, sign > 0 ? sin : neg(sin));
          expect_close(out, want, 0, 0);
        }
      }
    }
  }
}

TEST(LlamaCudaEmulatedTest, SwigluMatchesCpuKernel_ForwardAndBackward) {
  // The CPU's sigmoid is a fast exp within a few ulp; the kernel's is expf.
  uint64_t seed = 100;
  for (const Shape& shape : std::vector<Shape>{{0}, {1}, {257}, {3, 5, 17}, {4, 1000}}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str(shape));
      const double rtol = dtype == DType::kF32 ? 1e-5 : (dtype == DType::kBF16 ? 1e-2 : 2e-3);
      Tensor gate = random_input(shape, dtype, 3.0, seed++);
      Tensor up = random_input(shape, dtype, 2.0, seed++);
      const Tensor dy = random_input(shape, dtype, 1.0, seed++);
      Tensor out = zeros(shape, dtype, Device::cpu());
      Tensor grad_gate = zeros(shape, dtype, Device::cpu());
      Tensor grad_up = zeros(shape, dtype, Device::cpu());
      SwigluParams p;
      p.gate = gate.data_ptr();
      p.up = up.data_ptr();
      p.grad = dy.data_ptr();
      p.out = out.data_ptr();
      p.grad_gate = grad_gate.data_ptr();
      p.grad_up = grad_up.data_ptr();
      p.n = gate.numel();
      with_elem(elem_of(dtype), [&](auto e) {
        constexpr LlamaElem E = decltype(e)::value;
        emulate_launch(p.n, [&](int64_t i) { swiglu_forward_at<E>(p, i); });
        emulate_launch(p.n, [&](int64_t i) { swiglu_backward_at<E>(p, i); });
      });
      gate.set_requires_grad(true);
      up.set_requires_grad(true);
      const Tensor want = swiglu(gate, up);
      expect_close(out, detach(want), rtol, 1e-6);
      if (gate.numel() == 0) continue;
      backward(want, dy);
      expect_close(grad_gate, gate.grad(), rtol, 1e-5);
      expect_close(grad_up, up.grad(), rtol, 1e-6);
    }
  }
}

}  // namespace
}  // namespace tessel::kernels::cuda
