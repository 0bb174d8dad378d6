// CUDA kernels for the neural-net ops: softmax/log_softmax, layer_norm/rms_norm, embedding and
// cross-entropy, forward and backward. One block per row of C elements; the per-row formulas
// are the CPU's (cpu_nn.cc), step for step, with the row sums taken in a fixed tree order.
// Per-column sums over rows (norm weight/bias gradients) run in fixed blocks of rows whose
// results are combined in order; the embedding gradient sums each index's rows in position
// order after a stable sort: every result is deterministic.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "tessel/tensor/cuda/cuda_device.cuh"

namespace tessel::cuda {
namespace {

// Rows of the norm weight/bias gradients summed per block before blocks are combined.
constexpr int64_t kParamRowChunk = 256;

// Threads for rows of C elements (a function of C alone, so results repeat).
int row_threads(int64_t C, int max_threads = 1024) {
  int t = 32;
  while (t < max_threads && t * 4 < C) t *= 2;
  return t;
}

__device__ __forceinline__ float block_sum(float v, float* shared) {
  return block_reduce(v, SumOp{}, 0.0f, shared);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  return block_reduce(v, MaxSkipNanOp{}, -INFINITY, shared);
}

// The row's largest value and the sum of exp(x - largest) (every thread gets both). NaN is
// skipped by the max but makes the sum NaN, as do +inf and an all -inf row (as on the CPU).
template <typename T>
__device__ void row_max_sum_exp(const T* xr, int64_t C, float* shared, float* max_out,
                                float* sum_out) {
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(xr[c]);
    mx = v > mx ? v : mx;
  }
  mx = block_max(mx, shared);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    sum = add(sum, fast_exp(sub(to_f32(xr[c]), mx)));
  *max_out = mx;
  *sum_out = block_sum(sum, shared);
}

// ---- softmax ------------------------------------------------------------------------------------

template <typename T>
__global__ void softmax_kernel(const T* x, T* out, int64_t C, bool log) {
  __shared__ float shared[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * C;
  T* o = out + static_cast<int64_t>(blockIdx.x) * C;
  float mx, sum;
  row_max_sum_exp(xr, C, shared, &mx, &sum);
  if (log) {
    const float shift = add(mx, logf(sum));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      o[c] = convert<T>(sub(to_f32(xr[c]), shift));
  } else {
    const float inv = div(1.0f, sum);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      o[c] = convert<T>(mul(fast_exp(sub(to_f32(xr[c]), mx)), inv));
    }
  }
}

template <typename T>
__global__ void softmax_backward_kernel(const T* grad_y, const T* y, T* grad_x, int64_t C,
                                        bool log) {
  __shared__ float shared[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * C;
  const T* g = grad_y + base;
  const T* yr = y + base;
  T* o = grad_x + base;
  float acc = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gc = to_f32(g[c]);
    acc = add(acc, log ? gc : mul(gc, to_f32(yr[c])));
  }
  acc = block_sum(acc, shared);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gc = to_f32(g[c]), yc = to_f32(yr[c]);
    // log: g - exp(y) sum(g); else y (g - <g, y>).
    o[c] = convert<T>(log ? sub(gc, mul(fast_exp(yc), acc)) : mul(sub(gc, acc), yc));
  }
}

// ---- layer_norm / rms_norm ----------------------------------------------------------------------

// mean == nullptr: rms_norm.
template <typename T>
__global__ void norm_kernel(const T* x, const T* weight, const T* bias, T* out, float* mean,
                            float* rstd, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  T* o = out + row * C;
  const float n = static_cast<float>(C);
  float m = 0.0f, s;
  if (mean != nullptr) {
    float total = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) total = add(total, to_f32(xr[c]));
    m = div(block_sum(total, shared), n);
    float sq = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = sub(to_f32(xr[c]), m);
      sq = add(sq, mul(d, d));
    }
    s = div(1.0f, __fsqrt_rn(add(div(block_sum(sq, shared), n), eps)));
  } else {
    float sq = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float v = to_f32(xr[c]);
      sq = add(sq, mul(v, v));
    }
    s = div(1.0f, __fsqrt_rn(add(div(block_sum(sq, shared), n), eps)));
  }
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = m;
    rstd[row] = s;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = mul(sub(to_f32(xr[c]), m), s);
    if (weight != nullptr) v = mul(v, to_f32(weight[c]));
    if (bias != nullptr) v = add(v, to_f32(bias[c]));
    o[c] = convert<T>(v);
  }
}

// grad_x = rstd (wg - mean(wg) - xhat mean(wg xhat)) for layer_norm, rstd (wg - xhat mean(wg
// xhat)) for rms_norm; wg = grad * weight (grad without a weight).
template <typename T>
__global__ void norm_backward_input_kernel(const T* grad_y, const T* x, const T* weight,
                                           const float* mean, const float* rstd, T* grad_x,
                                           int64_t C) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* g = grad_y + row * C;
  const T* xr = x + row * C;
  T* o = grad_x + row * C;
  const float s = rstd[row];
  const float m = mean != nullptr ? mean[row] : 0.0f;
  auto wg_at = [&](int64_t c) {
    const float gc = to_f32(g[c]);
    return weight != nullptr ? mul(gc, to_f32(weight[c])) : gc;
  };
  auto xhat_at = [&](int64_t c) {
    return mean != nullptr ? mul(sub(to_f32(xr[c]), m), s) : mul(to_f32(xr[c]), s);
  };
  float sum_wg = 0.0f, dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float wg = wg_at(c);
    sum_wg = add(sum_wg, wg);
    dot = add(dot, mul(wg, xhat_at(c)));
  }
  sum_wg = block_sum(sum_wg, shared);
  dot = block_sum(dot, shared);
  if (mean != nullptr) {
    const float inv_n = div(1.0f, static_cast<float>(C));
    const float mean_wg = mul(sum_wg, inv_n), mean_wg_xhat = mul(dot, inv_n);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      o[c] = convert<T>(mul(sub(sub(wg_at(c), mul(xhat_at(c), mean_wg_xhat)), mean_wg), s));
    }
  } else {
    const float mean_dot = div(dot, static_cast<float>(C));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      o[c] = convert<T>(mul(sub(wg_at(c), mul(xhat_at(c), mean_dot)), s));
    }
  }
}

// Blocks of 32 columns x 8 row lanes over kParamRowChunk rows: partial sums of grad * xhat and
// grad per column (each lane its rows in order, then the lanes in order).
template <typename T>
__global__ void norm_params_kernel(const T* grad_y, const T* x, const float* mean,
                                   const float* rstd, int64_t R, int64_t C, float* partial_w,
                                   float* partial_b) {
  __shared__ float lanes_w[8][32], lanes_b[8][32];
  const int64_t tiles = (C + 31) / 32;
  const int64_t tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  const int64_t c = tile * 32 + threadIdx.x;
  const int64_t begin = chunk * kParamRowChunk;
  const int64_t end = begin + kParamRowChunk < R ? begin + kParamRowChunk : R;
  float w = 0.0f, b = 0.0f;
  if (c < C) {
    for (int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const float g = to_f32(grad_y[r * C + c]);
      const float xv = to_f32(x[r * C + c]);
      const float centred = mean != nullptr ? sub(xv, mean[r]) : xv;
      w = add(w, mul(mul(g, centred), rstd[r]));
      b = add(b, g);
    }
  }
  lanes_w[threadIdx.y][threadIdx.x] = w;
  lanes_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < 8; ++k) {
    w = add(w, lanes_w[k][threadIdx.x]);
    b = add(b, lanes_b[k][threadIdx.x]);
  }
  partial_w[chunk * C + c] = w;
  partial_b[chunk * C + c] = b;
}

__global__ void norm_params_combine_kernel(const float* partial_w, const float* partial_b,
                                           int64_t chunks, int64_t C, float* grad_weight,
                                           float* grad_bias) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w = 0.0f, b = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    w = add(w, partial_w[k * C + c]);
    b = add(b, partial_b[k * C + c]);
  }
  if (grad_weight != nullptr) grad_weight[c] = w;
  if (grad_bias != nullptr) grad_bias[c] = b;
}

// ---- embedding ----------------------------------------------------------------------------------

template <typename Bits>
__global__ void embedding_kernel(const Bits* weight, const int64_t* indices, Bits* out, int64_t V,
                                 int64_t D, DeviceErrorRecord* errors) {
  const int64_t n = blockIdx.x;
  const int64_t index = indices[n];
  Bits* o = out + n * D;
  if (index < 0 || index >= V) {
    if (threadIdx.x == 0) report_bad_index(errors, DeviceCheck::kEmbedding, index, n, V);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) o[d] = Bits(0);
    return;
  }
  const Bits* w = weight + index * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) o[d] = w[d];
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(i);
  }
}

// One block per sorted position; the first position of each index's run adds the run's rows,
// in position order, to that index's row of grad_weight (which only this block writes).
template <typename T>
__global__ void embedding_backward_kernel(const T* grad, const int64_t* sorted_index,
                                          const int32_t* sorted_position, float* grad_weight,
                                          int64_t N, int64_t V, int64_t D,
                                          DeviceErrorRecord* errors) {
  const int64_t k = blockIdx.x;
  const int64_t index = sorted_index[k];
  if (k > 0 && sorted_index[k - 1] == index) return;  // not the start of a run
  if (index < 0 || index >= V) {
    if (threadIdx.x == 0) {
      report_bad_index(errors, DeviceCheck::kEmbeddingBackward, index, sorted_position[k], V);
    }
    return;
  }
  int64_t end = k + 1;
  while (end < N && sorted_index[end] == index) ++end;
  float* gw = grad_weight + index * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = gw[d];
    for (int64_t j = k; j < end; ++j) acc = add(acc, to_f32(grad[sorted_position[j] * D + d]));
    gw[d] = acc;
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

template <typename T>
__global__ void cross_entropy_kernel(const T* logits, const int64_t* target, int64_t ignore_index,
                                     float* loss, float* lse, int64_t C,
                                     DeviceErrorRecord* errors) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  float mx, sum;
  row_max_sum_exp(xr, C, shared, &mx, &sum);
  if (threadIdx.x != 0) return;
  const float l = add(mx, logf(sum));
  lse[row] = l;
  const int64_t t = target[row];
  if (t == ignore_index) {
    loss[row] = 0.0f;
  } else if (t < 0 || t >= C) {
    report_bad_index(errors, DeviceCheck::kCrossEntropy, t, row, C);
    loss[row] = NAN;
  } else {
    loss[row] = sub(l, to_f32(xr[t]));
  }
}

// grad[r, c] = grad_loss[r] (softmax[r, c] - [c == target]), 0 on ignored rows.
template <typename T>
__global__ void cross_entropy_backward_kernel(const float* grad_loss, const T* logits,
                                              const int64_t* target, const float* lse,
                                              int64_t ignore_index, T* grad, int64_t C,
                                              DeviceErrorRecord* errors) {
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * C;
  T* o = grad + row * C;
  const int64_t t = target[row];
  if (t == ignore_index) {
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = convert<T>(0.0f);
    return;
  }
  const bool valid = t >= 0 && t < C;
  if (!valid && threadIdx.x == 0)
    report_bad_index(errors, DeviceCheck::kCrossEntropyBackward, t, row, C);
  const float g = grad_loss[row], l = lse[row];
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = mul(fast_exp(sub(to_f32(xr[c]), l)), g);
    if (c == t) v = sub(v, g);
    o[c] = convert<T>(v);
  }
}

unsigned int blocks(int64_t rows, const char* what) {
  if (rows >= (int64_t{1} << 31)) {
    throw_invalid_argument(std::string(what) + ": " + std::to_string(rows) +
                           " rows are more blocks than CUDA launches (at most 2^31 - 1)");
  }
  return static_cast<unsigned int>(rows);
}

int bits_for(int64_t V) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < V) ++bits;
  return bits;
}

// The embedding backward's scratch: sorted indices, positions before and after the sort, and
// CUB's temporary storage, each 256-byte aligned.
struct SortScratch {
  int64_t* sorted_index;
  int32_t* position;
  int32_t* sorted_position;
  void* temp;
  size_t temp_bytes;
};
size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }
size_t cub_sort_bytes(int64_t N, int64_t V) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(N), 0,
      bits_for(V));
  return bytes;
}
SortScratch sort_scratch(void* base, int64_t N, int64_t V) {
  char* p = static_cast<char*>(base);
  SortScratch s;
  s.sorted_index = reinterpret_cast<int64_t*>(p);
  p += align256(N * sizeof(int64_t));
  s.position = reinterpret_cast<int32_t*>(p);
  p += align256(N * sizeof(int32_t));
  s.sorted_position = reinterpret_cast<int32_t*>(p);
  p += align256(N * sizeof(int32_t));
  s.temp = p;
  s.temp_bytes = cub_sort_bytes(N, V);
  return s;
}

}  // namespace

void launch_softmax(const Launch& l, const void* x, void* out, DType dtype, int64_t R, int64_t C,
                    bool log) {
  if (R == 0 || C == 0) return;
  dispatch_floating(dtype, "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T><<<blocks(R, "softmax"), row_threads(C), 0, l.stream>>>(
        static_cast<const T*>(x), static_cast<T*>(out), C, log);
  });
  check_launch("softmax", l.device);
}

void launch_softmax_backward(const Launch& l, const void* grad_y, const void* y, void* grad_x,
                             DType dtype, int64_t R, int64_t C, bool log) {
  if (R == 0 || C == 0) return;
  dispatch_floating(dtype, "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T><<<blocks(R, "softmax_backward"), row_threads(C), 0, l.stream>>>(
        static_cast<const T*>(grad_y), static_cast<const T*>(y), static_cast<T*>(grad_x), C, log);
  });
  check_launch("softmax_backward", l.device);
}

void launch_norm(const Launch& l, const void* x, const void* weight, const void* bias, void* out,
                 float* mean, float* rstd, DType dtype, int64_t R, int64_t C, float eps) {
  if (R == 0) return;
  dispatch_floating(dtype, "norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_kernel<T><<<blocks(R, "norm"), row_threads(C, 512), 0, l.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
        static_cast<T*>(out), mean, rstd, C, eps);
  });
  check_launch(mean != nullptr ? "layer_norm" : "rms_norm", l.device);
}

void launch_norm_backward_input(const Launch& l, const void* grad_y, const void* x,
                                const void* weight, const float* mean, const float* rstd,
                                void* grad_x, DType dtype, int64_t R, int64_t C) {
  if (R == 0 || grad_x == nullptr) return;
  dispatch_floating(dtype, "norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_backward_input_kernel<T><<<blocks(R, "norm_backward"), row_threads(C, 512), 0, l.stream>>>(
        static_cast<const T*>(grad_y), static_cast<const T*>(x), static_cast<const T*>(weight),
        mean, rstd, static_cast<T*>(grad_x), C);
  });
  check_launch(mean != nullptr ? "layer_norm_backward" : "rms_norm_backward", l.device);
}

int64_t norm_backward_params_scratch_bytes(int64_t R, int64_t C) {
  const int64_t chunks = std::max<int64_t>((R + kParamRowChunk - 1) / kParamRowChunk, 1);
  return 2 * chunks * C * static_cast<int64_t>(sizeof(float));
}

void launch_norm_backward_params(const Launch& l, const void* grad_y, const void* x,
                                 const float* mean, const float* rstd, float* grad_weight,
                                 float* grad_bias, DType dtype, int64_t R, int64_t C,
                                 void* scratch) {
  if (C == 0 || (grad_weight == nullptr && grad_bias == nullptr)) return;
  const int64_t chunks = std::max<int64_t>((R + kParamRowChunk - 1) / kParamRowChunk, 1);
  const int64_t tiles = (C + 31) / 32;
  float* partial_w = static_cast<float*>(scratch);
  float* partial_b = partial_w + chunks * C;
  dispatch_floating(dtype, "norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_params_kernel<T><<<blocks(tiles * chunks, "norm_backward"), dim3(32, 8), 0, l.stream>>>(
        static_cast<const T*>(grad_y), static_cast<const T*>(x), mean, rstd, R, C, partial_w,
        partial_b);
  });
  check_launch("norm_backward_params", l.device);
  norm_params_combine_kernel<<<static_cast<unsigned>((C + 255) / 256), 256, 0, l.stream>>>(
      partial_w, partial_b, chunks, C, grad_weight, grad_bias);
  check_launch("norm_backward_params_combine", l.device);
}

void launch_embedding(const Launch& l, const void* weight, int element_size, const int64_t* indices,
                      void* out, int64_t N, int64_t V, int64_t D) {
  if (N == 0 || D == 0) return;
  auto run = [&](auto tag) {
    using Bits = typename decltype(tag)::type;
    embedding_kernel<Bits><<<blocks(N, "embedding"), row_threads(D, 256), 0, l.stream>>>(
        static_cast<const Bits*>(weight), indices, static_cast<Bits*>(out), V, D, l.errors);
  };
  switch (element_size) {
    case 1:
      run(TypeTag<uint8_t>{});
      break;
    case 2:
      run(TypeTag<uint16_t>{});
      break;
    case 4:
      run(TypeTag<uint32_t>{});
      break;
    case 8:
      run(TypeTag<uint64_t>{});
      break;
    default:
      throw_internal("embedding: element size " + std::to_string(element_size));
  }
  check_launch("embedding", l.device);
}

int64_t embedding_backward_scratch_bytes(int64_t N, int64_t V) {
  if (N == 0 || N >= (int64_t{1} << 31)) return 0;  // the launcher refuses the latter
  return static_cast<int64_t>(align256(N * sizeof(int64_t)) + 2 * align256(N * sizeof(int32_t)) +
                              cub_sort_bytes(N, V));
}

void launch_embedding_backward(const Launch& l, const void* grad, DType dtype,
                               const int64_t* indices, float* grad_weight, int64_t N, int64_t V,
                               int64_t D, void* scratch) {
  if (N == 0 || D == 0) return;
  if (N >= (int64_t{1} << 31)) {
    throw_invalid_argument("embedding backward: " + std::to_string(N) +
                           " indices; at most 2^31 - 1 are supported");
  }
  SortScratch s = sort_scratch(scratch, N, V);
  iota_kernel<<<grid_for(N, l), kThreads, 0, l.stream>>>(s.position, N);
  check_launch("embedding_backward_iota", l.device);
  // A stable sort by index: equal indices keep their positions' order. Only the bits a valid
  // index can have take part; an invalid index is reported by the kernel below.
  check_cuda(cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, indices, s.sorted_index,
                                             s.position, s.sorted_position, static_cast<int>(N), 0,
                                             bits_for(V), l.stream),
             "cub::DeviceRadixSort::SortPairs (embedding backward)", l.device);
  dispatch_floating(dtype, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_backward_kernel<T>
        <<<blocks(N, "embedding_backward"), row_threads(D, 256), 0, l.stream>>>(
            static_cast<const T*>(grad), s.sorted_index, s.sorted_position, grad_weight, N, V, D,
            l.errors);
  });
  check_launch("embedding_backward", l.device);
}

void launch_cross_entropy(const Launch& l, const void* logits, DType dtype, const int64_t* target,
                          int64_t ignore_index, float* loss, float* lse, int64_t R, int64_t C) {
  if (R == 0) return;
  dispatch_floating(dtype, "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_kernel<T><<<blocks(R, "cross_entropy"), row_threads(C), 0, l.stream>>>(
        static_cast<const T*>(logits), target, ignore_index, loss, lse, C, l.errors);
  });
  check_launch("cross_entropy", l.device);
}

void launch_cross_entropy_backward(const Launch& l, const float* grad_loss, const void* logits,
                                   DType dtype, const int64_t* target, const float* lse,
                                   int64_t ignore_index, void* grad_logits, int64_t R, int64_t C) {
  if (R == 0 || C == 0) return;
  dispatch_floating(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_backward_kernel<T>
        <<<blocks(R, "cross_entropy_backward"), row_threads(C), 0, l.stream>>>(
            grad_loss, static_cast<const T*>(logits), target, lse, ignore_index,
            static_cast<T*>(grad_logits), C, l.errors);
  });
  check_launch("cross_entropy_backward", l.device);
}

}  // namespace tessel::cuda
