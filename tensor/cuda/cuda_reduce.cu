// CUDA reductions (sum, avg, max, min, product) over the rows or the leading dim of a
// contiguous [R, C] array, and argmax along rows. Long rows and tall columns are cut into
// chunks reduced by separate blocks; the partials are then combined per output by a block (a
// full reduction's one output) or by a thread (many outputs), as cuda_reduce_plan.h decides. The
// combination order depends only on the shape (fixed chunk sizes, fixed block sizes, butterfly
// exchanges), never on the device, so results repeat bit for bit; it differs from the CPU's order,
// so sums agree with the CPU's within rounding.
#include <cmath>

#include "tessel/tensor/cuda/cuda_device.cuh"
#include "tessel/tensor/cuda/cuda_reduce_plan.h"

namespace tessel::cuda {
namespace {

// Rows longer than this are cut into chunks reduced by separate blocks, then combined in order.
constexpr int64_t kRowChunk = 16384;
// Leading-dim reductions combine this many rows per block, then the blocks' results in order.
constexpr int64_t kColChunk = 256;

template <typename C>
struct Combine {
  ReduceOp op;
  __device__ __forceinline__ C identity() const {
    switch (op) {
      case ReduceOp::kProduct:
        return C(1);
      case ReduceOp::kMax:
        if constexpr (std::is_floating_point_v<C>)
          return -INFINITY;
        else
          return C(INT64_MIN);
      case ReduceOp::kMin:
        if constexpr (std::is_floating_point_v<C>)
          return INFINITY;
        else
          return C(INT64_MAX);
      default:
        return C(0);
    }
  }
  // acc combined with v; max and min keep the first NaN (NaN propagates), as the CPU's.
  __device__ __forceinline__ C operator()(C acc, C v) const {
    switch (op) {
      case ReduceOp::kProduct:
        return acc * v;
      case ReduceOp::kMax:
        return (acc != acc || acc >= v) ? acc : v;
      case ReduceOp::kMin:
        return (acc != acc || acc <= v) ? acc : v;
      default:
        return acc + v;
    }
  }
  __device__ __forceinline__ C finish(C acc, int64_t count) const {
    if (op != ReduceOp::kAvg) return acc;
    if constexpr (std::is_floating_point_v<C>)
      return __fdiv_rn(acc, static_cast<float>(count));
    else
      return acc / count;
  }
};

// The block size for rows of C elements: a function of C alone.
int row_threads(int64_t C) {
  int t = 32;
  while (t < 512 && t * 4 < C) t *= 2;
  return t;
}

// One block per (row, chunk): combines x[row][chunk) into partial, or into out (finished) when
// the row is one chunk.
template <typename T, typename Out>
__global__ void reduce_rows_kernel(ReduceOp op, const T* x, int64_t C, int64_t chunks,
                                   Compute<T>* partial, Out* out) {
  using Acc = Compute<T>;
  __shared__ Acc shared[32];
  const Combine<Acc> combine{op};
  const int64_t row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int64_t begin = chunk * kRowChunk;
  const int64_t end = begin + kRowChunk < C ? begin + kRowChunk : C;
  const T* xr = x + row * C;
  Acc acc = combine.identity();
  for (int64_t c = begin + threadIdx.x; c < end; c += blockDim.x) {
    acc = combine(acc, convert<Acc>(xr[c]));
  }
  acc = block_reduce(acc, combine, combine.identity(), shared);
  if (threadIdx.x != 0) return;
  if (chunks == 1) {
    out[row] = convert<Out>(combine.finish(acc, C));
  } else {
    partial[blockIdx.x] = acc;
  }
}

// out[row] = the row's chunks combined in order.
template <typename Acc, typename Out>
__global__ void combine_chunks_kernel(ReduceOp op, const Acc* partial, int64_t rows, int64_t chunks,
                                      int64_t count, Out* out, int64_t chunk_stride,
                                      int64_t row_stride) {
  const Combine<Acc> combine{op};
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  Acc acc = combine.identity();
  for (int64_t k = 0; k < chunks; ++k)
    acc = combine(acc, partial[row * row_stride + k * chunk_stride]);
  out[row] = convert<Out>(combine.finish(acc, count));
}

// One block per output (cuda_reduce_plan.h): thread t combines chunks t, t + blockDim.x, ... in
// order, then the block combines its threads' results.
template <typename Acc, typename Out>
__global__ void combine_chunks_block_kernel(ReduceOp op, const Acc* partial, int64_t chunks,
                                            int64_t count, Out* out, int64_t chunk_stride,
                                            int64_t row_stride) {
  __shared__ Acc shared[32];
  const Combine<Acc> combine{op};
  const int64_t row = blockIdx.x;
  Acc acc = combine.identity();
  for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x)
    acc = combine(acc, partial[row * row_stride + k * chunk_stride]);
  acc = block_reduce(acc, combine, combine.identity(), shared);
  if (threadIdx.x == 0) out[row] = convert<Out>(combine.finish(acc, count));
}

// Combines each output's chunk partials as plan_chunk_combine says.
template <typename Acc, typename Out>
void launch_combine_chunks(const Launch& l, ReduceOp op, const Acc* partial, int64_t outputs,
                           int64_t chunks, int64_t count, Out* out, int64_t chunk_stride,
                           int64_t row_stride) {
  const ChunkCombine plan = plan_chunk_combine(outputs, chunks);
  if (plan.blocks == 0) return;
  if (plan.per_block) {
    combine_chunks_block_kernel<Acc, Out>
        <<<static_cast<unsigned>(plan.blocks), plan.threads, 0, l.stream>>>(
            op, partial, chunks, count, out, chunk_stride, row_stride);
  } else {
    combine_chunks_kernel<Acc, Out>
        <<<static_cast<unsigned>(plan.blocks), plan.threads, 0, l.stream>>>(
            op, partial, outputs, chunks, count, out, chunk_stride, row_stride);
  }
  check_launch("reduce_combine", l.device);
}

// Blocks of 32 columns x 8 row lanes; block (tile, chunk) combines rows [chunk * kColChunk,
// ...) of its 32 columns: each lane its rows in order, then the 8 lanes in order.
template <typename T, typename Out>
__global__ void reduce_cols_kernel(ReduceOp op, const T* x, int64_t R, int64_t C, int64_t chunks,
                                   Compute<T>* partial, Out* out) {
  using Acc = Compute<T>;
  __shared__ Acc lanes[8][32];
  const Combine<Acc> combine{op};
  const int64_t tiles = (C + 31) / 32;
  const int64_t tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  const int64_t c = tile * 32 + threadIdx.x;
  const int64_t begin = chunk * kColChunk;
  const int64_t end = begin + kColChunk < R ? begin + kColChunk : R;
  Acc acc = combine.identity();
  if (c < C) {
    for (int64_t r = begin + threadIdx.y; r < end; r += 8)
      acc = combine(acc, convert<Acc>(x[r * C + c]));
  }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < 8; ++k) acc = combine(acc, lanes[k][threadIdx.x]);
  if (chunks == 1) {
    out[c] = convert<Out>(combine.finish(acc, R));
  } else {
    partial[chunk * C + c] = acc;
  }
}

// ---- argmax -------------------------------------------------------------------------------------

// The better of two candidates (value, index; index < 0: none): NaN counts as largest, ties go
// to the smaller index, so the result is the first largest element.
template <typename V>
__device__ __forceinline__ void better(V& v, int64_t& i, V ov, int64_t oi) {
  if (oi < 0) return;
  if (i < 0) {
    v = ov;
    i = oi;
    return;
  }
  const bool nan = v != v, onan = ov != ov;
  bool take;
  if (nan || onan) {
    take = onan && (!nan || oi < i);
  } else {
    take = ov > v || (ov == v && oi < i);
  }
  if (take) {
    v = ov;
    i = oi;
  }
}

template <typename T>
__global__ void argmax_rows_kernel(const T* x, int64_t C, int64_t* out) {
  using V = Compute<T>;
  __shared__ V shared_v[32];
  __shared__ int64_t shared_i[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * C;
  V v = V(0);
  int64_t i = -1;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) better(v, i, convert<V>(xr[c]), c);
  for (int offset = 16; offset > 0; offset >>= 1) {
    const V ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, offset);
    better(v, i, ov, oi);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    shared_v[warp] = v;
    shared_i[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    better(v, i, shared_v[w], shared_i[w]);
  out[blockIdx.x] = i;
}

// The (input, output) element types reductions take: the input's own, i64 (integer sums) or
// f32 (16-bit floats summed without rounding, e.g. a bias gradient).
template <typename F>
void dispatch_reduce_types(DType x_dtype, DType out_dtype, F&& f) {
  dispatch_all(x_dtype, [&](auto in_tag) {
    using T = typename decltype(in_tag)::type;
    if (out_dtype == x_dtype) {
      f(in_tag, TypeTag<T>{});
    } else if (out_dtype == DType::kI64) {
      f(in_tag, TypeTag<int64_t>{});
    } else if (out_dtype == DType::kF32 && is_floating(x_dtype)) {
      f(in_tag, TypeTag<float>{});
    } else {
      throw_invalid_argument("reduce: a " + std::string(dtype_name(x_dtype)) +
                             " input reduces into " + std::string(dtype_name(x_dtype)) +
                             ", i64 or (floating inputs) f32, not " +
                             std::string(dtype_name(out_dtype)));
    }
  });
}

}  // namespace

int64_t reduce_rows_scratch_bytes(int64_t R, int64_t C) {
  const int64_t chunks = (C + kRowChunk - 1) / kRowChunk;
  return chunks > 1 ? R * chunks * static_cast<int64_t>(sizeof(int64_t)) : 0;
}

void launch_reduce_rows(const Launch& l, ReduceOp op, const void* x, DType x_dtype, void* out,
                        DType out_dtype, int64_t R, int64_t C, void* scratch) {
  if (R == 0) return;
  const int64_t chunks = C > kRowChunk ? (C + kRowChunk - 1) / kRowChunk : 1;
  if (R * chunks >= (int64_t{1} << 31)) {
    throw_invalid_argument("reduce: " + std::to_string(R) + " rows of " + std::to_string(C) +
                           " elements are more blocks than CUDA launches");
  }
  dispatch_reduce_types(x_dtype, out_dtype, [&](auto in_tag, auto out_tag) {
    using T = typename decltype(in_tag)::type;
    using Out = typename decltype(out_tag)::type;
    using Acc = Compute<T>;
    auto* partial = static_cast<Acc*>(scratch);
    reduce_rows_kernel<T, Out><<<static_cast<unsigned>(R * chunks), row_threads(C), 0, l.stream>>>(
        op, static_cast<const T*>(x), C, chunks, partial, static_cast<Out*>(out));
    check_launch("reduce_rows", l.device);
    launch_combine_chunks<Acc, Out>(l, op, partial, R, chunks, C, static_cast<Out*>(out), 1,
                                    chunks);
  });
}

int64_t reduce_cols_scratch_bytes(int64_t R, int64_t C) {
  const int64_t chunks = (R + kColChunk - 1) / kColChunk;
  return chunks > 1 ? chunks * C * static_cast<int64_t>(sizeof(int64_t)) : 0;
}

void launch_reduce_cols(const Launch& l, ReduceOp op, const void* x, DType x_dtype, void* out,
                        DType out_dtype, int64_t R, int64_t C, void* scratch) {
  if (C == 0) return;
  const int64_t chunks = R > kColChunk ? (R + kColChunk - 1) / kColChunk : 1;
  const int64_t tiles = (C + 31) / 32;
  if (tiles * chunks >= (int64_t{1} << 31)) {
    throw_invalid_argument("reduce: " + std::to_string(R) + " x " + std::to_string(C) +
                           " is more blocks than CUDA launches");
  }
  dispatch_reduce_types(x_dtype, out_dtype, [&](auto in_tag, auto out_tag) {
    using T = typename decltype(in_tag)::type;
    using Out = typename decltype(out_tag)::type;
    using Acc = Compute<T>;
    auto* partial = static_cast<Acc*>(scratch);
    reduce_cols_kernel<T, Out><<<static_cast<unsigned>(tiles * chunks), dim3(32, 8), 0, l.stream>>>(
        op, static_cast<const T*>(x), R, C, chunks, partial, static_cast<Out*>(out));
    check_launch("reduce_cols", l.device);
    // Column c's partials sit at k * C + c.
    launch_combine_chunks<Acc, Out>(l, op, partial, C, chunks, R, static_cast<Out*>(out), C, 1);
  });
}

void launch_argmax_rows(const Launch& l, const void* x, DType dtype, int64_t* out, int64_t R,
                        int64_t C) {
  if (R == 0) return;
  if (R >= (int64_t{1} << 31)) {
    throw_invalid_argument("argmax: " + std::to_string(R) +
                           " rows are more blocks than CUDA launches");
  }
  dispatch_all(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    argmax_rows_kernel<T><<<static_cast<unsigned>(R), row_threads(C), 0, l.stream>>>(
        static_cast<const T*>(x), C, out);
  });
  check_launch("argmax_rows", l.device);
}

}  // namespace tessel::cuda
