#pragma once
// Tensor operations: creation, views, elementwise math with broadcasting, reductions, neural-net
// ops and matmul. Free functions over Tensor (MLX style); each op checks its arguments, makes
// its output, records autograd (tensor/autograd.h) and runs the kernel of the inputs' device
// (tensor/backend.h).
//
//   Tensor x = randn({8, 16});
//   Tensor w = randn({32, 16}).set_requires_grad(true);
//   Tensor y = gelu(linear(x, w));                       // [8, 32]
//   Tensor loss = mean(mul(y, y));
//   backward(loss);
//
// Conventions for every op here:
// - Inputs must be on one device; mismatches throw InvalidArgument naming both devices.
// - Broadcasting follows NumPy: shapes align from the right; a size-1 dim stretches. Shapes that
//   do not broadcast throw InvalidArgument naming both shapes.
// - Dtype promotion (promote_types): floating beats integer; f32 beats bf16/f16; bf16 with f16
//   gives f32; i64 beats i32 beats bool. Scalars (double) take the tensor's dtype, except that a
//   floating op on an integer tensor gives f32. bf16/f16 math runs in f32 and rounds once.
// - Dims may be negative (counting from the end); out-of-range dims throw OutOfRange.
// - Outputs are new contiguous tensors unless the op is a view (views share storage and are
//   differentiable). In-place ops (suffix _) are never recorded by autograd and throw when the
//   target requires a gradient while grad mode is on.
// - Differentiable: every floating-point op below except comparisons, argmax and the in-place
//   ones. Integer results never require a gradient.
// - Thread-safety: ops are safe to call concurrently on different tensors; CPU kernels use the
//   thread pool of tensor/thread_pool.h.

#include <cstdint>
#include <cstring>
#include <vector>

#include "tessel/tensor/random.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

DType promote_types(DType a, DType b);
// The shape a and b broadcast to; throws InvalidArgument naming both when they do not.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// ---- Creation (ops_creation.cc) ----------------------------------------------------------------

Tensor ones(const Shape& shape, DType dtype = DType::kF32, Device device = default_device());
Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
            Device device = default_device());
// A 0-dim tensor holding value.
Tensor scalar_tensor(double value, DType dtype = DType::kF32, Device device = default_device());
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) in steps of step (step != 0); 1-D.
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::kI64,
              Device device = default_device());
Tensor arange(int64_t end, DType dtype = DType::kI64, Device device = default_device());
// Uniform in [0, 1) / standard normal, from gen (default: default_generator()). Element i is
// the counter-based value at the generator's offset + i (see random.h): the same for any
// thread count or device. Floating dtypes only.
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::kF32,
            Device device = default_device());
Tensor rand(const Shape& shape, DType dtype = DType::kF32, Device device = default_device());
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::kF32,
             Device device = default_device());
Tensor randn(const Shape& shape, DType dtype = DType::kF32, Device device = default_device());

// In place (not recorded): fill t with draws from gen (default: default_generator()), like
// rand/randn of t's shape. For a shard (t.shard_info() set), the generator advances by the
// global tensor's element count and t receives its box of the global draw: a sharded model is
// initialised exactly like the whole one. Floating dtypes only.
void uniform_(const Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);

// ---- Conversion and copies (ops_creation.cc) -------------------------------------------------

// t converted to dtype (t itself when it already has it). Differentiable between floats.
Tensor to(const Tensor& t, DType dtype);
// t on device (t itself when already there). Differentiable (the gradient moves back). A copy
// from a device to the CPU waits for the data; with non_blocking a copy from pinned host memory
// to a device may still run when this returns (order later work with the stream). Throws
// Unavailable when the device does not exist in this process or build, and InvalidArgument
// when t is a meta tensor (it has no values to copy); t.to(Device::meta()) is an empty meta
// tensor of t's shape.
Tensor to(const Tensor& t, Device device, bool non_blocking = false);
// A copy of CPU tensor t in page-locked memory (t itself when already pinned); throws
// Unavailable without a pinned allocator (see storage.h).
Tensor pin_memory(const Tensor& t);
// A contiguous copy with its own storage. Differentiable.
Tensor clone(const Tensor& t);
// t when contiguous, else a contiguous copy. Differentiable.
Tensor contiguous(const Tensor& t);
// Copies src (broadcast to dst's shape, converted to dst's dtype) into dst; src may be on
// another device (see to() for non_blocking). Not recorded.
void copy_(const Tensor& dst, const Tensor& src, bool non_blocking = false);
void fill_(const Tensor& dst, double value);
void zero_(const Tensor& dst);
// The value of a one-element tensor (waits for device work that produces it); throws
// InvalidArgument naming the shape otherwise, or for a meta tensor.
double item(const Tensor& t);
int64_t item_int(const Tensor& t);
// All elements in row-major order, converted to T (f32 -> float, etc.).
template <typename T>
std::vector<T> to_vector(const Tensor& t);

// ---- Views (ops_view.cc); share storage, differentiable ---------------------------------------

// Same elements, new shape (one -1 is inferred). Throws InvalidArgument when the strides cannot
// express it without a copy (use reshape) or the element counts differ.
Tensor view(const Tensor& t, const Shape& shape);
// view() when possible, else a contiguous copy reshaped.
Tensor reshape(const Tensor& t, const Shape& shape);
// Merges dims start..end into one.
Tensor flatten(const Tensor& t, int64_t start_dim = 0, int64_t end_dim = -1);
// dims is a permutation of 0..dim()-1.
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
// length elements of dim starting at start (0 <= start, start + length <= size).
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// Python-style t[..., start:end:step, ...] on dim (negative start/end count from the end and
// are clamped; step >= 1).
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
// t[..., index, ...]: removes dim.
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& t, int64_t dim);
// Removes dim, which must have size 1.
Tensor squeeze(const Tensor& t, int64_t dim);
// Broadcasts size-1 dims (and new leading dims) to shape; -1 keeps a size.
Tensor expand(const Tensor& t, const Shape& shape);
// Pieces of split_size along dim (the last may be smaller).
std::vector<Tensor> split(const Tensor& t, int64_t split_size, int64_t dim = 0);
// `chunks` pieces along dim of ceil(size / chunks) each (fewer when the size is small).
std::vector<Tensor> chunk(const Tensor& t, int64_t chunks, int64_t dim = 0);
// Concatenation along dim (a copy). Tensors agree on every other dim and on dtype.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

// ---- Elementwise (ops_elementwise.cc) ----------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // integer inputs give f32
Tensor pow(const Tensor& a, const Tensor& b);  // integer inputs give f32
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor sub(double a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor div(double a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);

Tensor neg(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor rsqrt(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor relu(const Tensor& t);
Tensor silu(const Tensor& t);
enum class GeluApproximation { kNone, kTanh };
// kNone: x * Phi(x) (erf); kTanh: the GPT-2 tanh approximation.
Tensor gelu(const Tensor& t, GeluApproximation approximation = GeluApproximation::kNone);

// Comparisons give bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor logical_not(const Tensor& t);

// cond (bool) ? a : b, all three broadcast together; a and b promote.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// t with value wherever mask (bool, broadcastable to t) is true.
Tensor masked_fill(const Tensor& t, const Tensor& mask, double value);

// In place (not recorded): dst += alpha * src, dst *= value. src broadcasts to dst.
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
void mul_(const Tensor& dst, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& t);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);

// ---- Reductions (ops_reduce.cc) ----------------------------------------------------------------

// Sum/mean over dims (empty: over all dims); keepdim keeps them as size 1. Sum of integers
// gives i64; mean needs a floating tensor. Order of summation is fixed (deterministic).
Tensor sum(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& t, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Largest / smallest element of all of t, or along one dim. Gradient goes to the maxima
// (shared evenly between ties).
Tensor max(const Tensor& t);
Tensor max(const Tensor& t, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& t);
Tensor min(const Tensor& t, int64_t dim, bool keepdim = false);
// Index (i64) of the first largest element along dim.
Tensor argmax(const Tensor& t, int64_t dim, bool keepdim = false);
// Sums t down to `shape` (which t's shape broadcasts from): the adjoint of expand.
Tensor sum_to(const Tensor& t, const Shape& shape);

// ---- Neural-net ops (ops_nn.cc) ----------------------------------------------------------------

Tensor softmax(const Tensor& t, int64_t dim = -1);
Tensor log_softmax(const Tensor& t, int64_t dim = -1);
// Normalises over the last dim; weight and bias ([last dim], same dtype) may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// weight [V, D] (floating), indices (i64/i32, any shape) -> [indices..., D]. An index outside
// [0, V) throws OutOfRange naming it.
Tensor embedding(const Tensor& weight, const Tensor& indices);
enum class Reduction { kMean, kSum, kNone };
// logits [N, C] (or [..., C]) and integer target [N] (or [...]); rows whose target equals
// ignore_index contribute nothing (kMean divides by the rows not ignored). Loss is f32. A target
// outside [0, C) (and not ignore_index) throws OutOfRange naming it.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::kMean);
// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training;
// identity otherwise. Uses gen (default: default_generator()).
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* gen = nullptr);

// ---- Linear algebra (ops_linalg.cc) -----------------------------------------------------------

// NumPy matmul: 1-D operands are promoted and the added dim removed; batch dims broadcast.
// f32 and bf16 run natively on oneDNN (bf16 accumulates in f32); f16 computes in f32.
// Throws InvalidArgument naming both shapes when the inner dims differ.
Tensor matmul(const Tensor& a, const Tensor& b);
// a [B, M, K] @ b [B, K, N] -> [B, M, N].
Tensor bmm(const Tensor& a, const Tensor& b);
// x [..., in] @ weight[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- Implementation of templates
// -----------------------------------------------------------------

template <typename T>
std::vector<T> to_vector(const Tensor& t) {
  static_assert(!std::is_same_v<T, bool>,
                "to_vector<bool> is not supported; use to_vector<int32_t>");
  Tensor c = contiguous(to(to(t, Device::cpu()), dtype_of<T>()));
  std::vector<T> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(T));
  return out;
}

}  // namespace tessel
