// CUDA kernels: copy/convert, fill, arange, random, unary, binary and where. One grid-stride
// kernel walks any strided layout through an Indexer (cuda_indexer.h); each op is a small
// functor applied at the operands' offsets. The arithmetic is the CPU kernels' (cpu_vector.cc),
// operation for operation without fused multiply-adds: results agree with the CPU's within an
// ulp or two (log and pow are CUDA's; the CPU's vector clones may fuse multiply-adds). Copies,
// fills, arange and random draws equal the CPU's bit for bit.
#include "tessel/tensor/cuda/cuda_device.cuh"

namespace tessel::cuda {
namespace {

// ---- The strided loop ---------------------------------------------------------------------------

template <int N, typename IndexT, typename F>
__global__ void elementwise_kernel(Indexer<N> ix, IndexT n, F f) {
  const IndexT step = static_cast<IndexT>(gridDim.x) * blockDim.x;
  for (IndexT i = static_cast<IndexT>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    IndexT off[N];
    ix.offsets(i, off);
    f(off);
  }
}

// Runs f at every element's offsets, with 32-bit index arithmetic where it fits.
template <int N, typename F>
void for_each_element(const Launch& l, const char* kernel, const Indexer<N>& ix, int64_t n,
                      const F& f) {
  if (n == 0) return;
  if (ix.fits_32bit(n)) {
    elementwise_kernel<N, uint32_t>
        <<<grid_for(n, l), kThreads, 0, l.stream>>>(ix, static_cast<uint32_t>(n), f);
  } else {
    elementwise_kernel<N, int64_t><<<grid_for(n, l), kThreads, 0, l.stream>>>(ix, n, f);
  }
  check_launch(kernel, l.device);
}

// ---- copy, fill, arange -------------------------------------------------------------------------

template <typename In, typename Out>
struct CopyFn {
  const In* src;
  Out* dst;
  template <typename I>
  __device__ void operator()(const I (&off)[2]) const {
    dst[off[1]] = convert<Out>(src[off[0]]);
  }
};

template <typename Bits>
struct FillFn {
  Bits* dst;
  Bits value;
  template <typename I>
  __device__ void operator()(const I (&off)[1]) const {
    dst[off[0]] = value;
  }
};

template <typename T>
__global__ void arange_kernel(T* dst, int64_t n, double start, double step) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = convert<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
  }
}

// ---- random: random.h's Philox4x32-10 and its uniform and normal
// ----------------------------------

struct Philox {
  uint32_t w[4];
};

__device__ __forceinline__ Philox philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox{{c0, c1, c2, c3}};
}

__device__ __forceinline__ Philox philox_at(uint64_t seed, uint64_t index) {
  return philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0,
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

constexpr float kTwoPow24Inv = 1.0f / 16777216.0f;

__device__ __forceinline__ float philox_uniform(const Philox& r) {
  return mul(static_cast<float>(r.w[0] >> 8), kTwoPow24Inv);
}

// As random.cc: log and cos in double, rounded to f32 (CUDA's double log and cos are within 2
// ulps; the exact values lie at least 9 ulps from an f32 rounding boundary for every argument
// the stream can produce, so the f32 results are the CPU's).
__device__ __forceinline__ float philox_normal(const Philox& r) {
  const float u1 = mul(add(static_cast<float>(r.w[0] >> 8), 1.0f), kTwoPow24Inv);
  const float u2 = mul(static_cast<float>(r.w[1] >> 8), kTwoPow24Inv);
  const float log_u1 = static_cast<float>(log(static_cast<double>(u1)));
  const float angle = mul(mul(2.0f, 3.14159265358979323846f), u2);
  const float cos_u2 = static_cast<float>(cos(static_cast<double>(angle)));
  return mul(__fsqrt_rn(mul(-2.0f, log_u1)), cos_u2);
}

template <typename T>
__global__ void random_kernel(T* dst, int64_t n, RandomDistribution dist, float a, float b,
                              uint64_t seed, uint64_t offset) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Philox r = philox_at(seed, offset + static_cast<uint64_t>(i));
    float v = 0.0f;
    switch (dist) {
      case RandomDistribution::kUniform:
        v = add(a, mul(sub(b, a), philox_uniform(r)));
        break;
      case RandomDistribution::kNormal:
        v = add(a, mul(b, philox_normal(r)));
        break;
      case RandomDistribution::kBernoulli:
        v = philox_uniform(r) < a ? b : 0.0f;
        break;
    }
    dst[i] = convert<T>(v);
  }
}

// ---- unary
// ----------------------------------------------------------------------------------------

__device__ __forceinline__ float unary_f32(UnaryOp op, float v) {
  switch (op) {
    case UnaryOp::kNeg:
      return -v;
    case UnaryOp::kExp:
      return fast_exp(v);
    case UnaryOp::kLog:
      return logf(v);
    case UnaryOp::kSqrt:
      return __fsqrt_rn(v);
    case UnaryOp::kRsqrt:
      return div(1.0f, __fsqrt_rn(v));
    case UnaryOp::kTanh:
      return fast_tanh(v);
    case UnaryOp::kRelu:
      return v <= 0.0f ? 0.0f : v;  // NaN stays, -0 gives +0
    case UnaryOp::kSilu:
      return mul(v, fast_sigmoid(v));
    case UnaryOp::kGelu:
      return mul(v, fast_normal_cdf(v));
    case UnaryOp::kGeluTanh:
      return mul(v, gelu_tanh_gate(v));
    case UnaryOp::kAbs:
      return fabsf(v);
    case UnaryOp::kSigmoid:
      return fast_sigmoid(v);
    case UnaryOp::kLogicalNot:
      return v == 0.0f ? 1.0f : 0.0f;
  }
  return v;
}

__device__ __forceinline__ int64_t unary_int(UnaryOp op, int64_t v) {
  switch (op) {
    case UnaryOp::kNeg:
      return -v;
    case UnaryOp::kAbs:
      return v < 0 ? -v : v;
    case UnaryOp::kRelu:
      return v > 0 ? v : 0;
    case UnaryOp::kLogicalNot:
      return v == 0 ? 1 : 0;
    default:
      return v;  // refused on the host
  }
}

template <typename T, typename Out>
struct UnaryFn {
  UnaryOp op;
  const T* x;
  Out* out;
  template <typename I>
  __device__ void operator()(const I (&off)[2]) const {
    if constexpr (kIsFloat<T>) {
      out[off[1]] = convert<Out>(unary_f32(op, to_f32(x[off[0]])));
    } else {
      out[off[1]] = convert<Out>(unary_int(op, convert<int64_t>(x[off[0]])));
    }
  }
};

// ---- binary
// ---------------------------------------------------------------------------------------

constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kGeluCoeff = 0.044715f;

__device__ __forceinline__ float gelu_tanh_grad(float g, float v) {
  const float s = gelu_tanh_gate(v);
  const float v2 = mul(v, v) > 1e4f ? 1e4f : mul(v, v);
  const float du = mul(kSqrt2OverPi, add(1.0f, mul(mul(3.0f, kGeluCoeff), v2)));
  return mul(g, add(s, mul(mul(v, mul(s, sub(1.0f, s))), mul(2.0f, du))));
}

__device__ __forceinline__ float binary_f32(BinaryOp op, float p, float q) {
  switch (op) {
    case BinaryOp::kAdd:
      return add(p, q);
    case BinaryOp::kSub:
      return sub(p, q);
    case BinaryOp::kMul:
      return mul(p, q);
    case BinaryOp::kDiv:
      return div(p, q);
    case BinaryOp::kPow:
      return powf(p, q);
    case BinaryOp::kMaximum:
      return (p != p || p > q) ? p : q;
    case BinaryOp::kMinimum:
      return (p != p || p < q) ? p : q;
    case BinaryOp::kEq:
      return p == q ? 1.0f : 0.0f;
    case BinaryOp::kNe:
      return p != q ? 1.0f : 0.0f;
    case BinaryOp::kLt:
      return p < q ? 1.0f : 0.0f;
    case BinaryOp::kLe:
      return p <= q ? 1.0f : 0.0f;
    case BinaryOp::kGt:
      return p > q ? 1.0f : 0.0f;
    case BinaryOp::kGe:
      return p >= q ? 1.0f : 0.0f;
    case BinaryOp::kGeluBackward:
      return mul(
          p, add(fast_normal_cdf(q), mul(mul(q, kInvSqrt2Pi), fast_exp(mul(mul(-0.5f, q), q)))));
    case BinaryOp::kGeluTanhBackward:
      return gelu_tanh_grad(p, q);
    case BinaryOp::kSiluBackward: {
      const float s = fast_sigmoid(q);
      return mul(mul(p, s), add(1.0f, mul(q, sub(1.0f, s))));
    }
    case BinaryOp::kReluBackward:
      return q <= 0.0f ? 0.0f : p;  // as PyTorch: NaN passes
  }
  return p;
}

__device__ __forceinline__ int64_t binary_int(BinaryOp op, int64_t x, int64_t y) {
  switch (op) {
    case BinaryOp::kAdd:
      return x + y;
    case BinaryOp::kSub:
      return x - y;
    case BinaryOp::kMul:
      return x * y;
    case BinaryOp::kMaximum:
      return x > y ? x : y;
    case BinaryOp::kMinimum:
      return x < y ? x : y;
    case BinaryOp::kEq:
      return x == y;
    case BinaryOp::kNe:
      return x != y;
    case BinaryOp::kLt:
      return x < y;
    case BinaryOp::kLe:
      return x <= y;
    case BinaryOp::kGt:
      return x > y;
    case BinaryOp::kGe:
      return x >= y;
    default:
      return 0;  // refused on the host
  }
}

template <typename T, typename Out>
struct BinaryFn {
  BinaryOp op;
  const T* a;
  const T* b;
  Out* out;
  template <typename I>
  __device__ void operator()(const I (&off)[3]) const {
    if constexpr (kIsFloat<T>) {
      out[off[2]] = convert<Out>(binary_f32(op, to_f32(a[off[0]]), to_f32(b[off[1]])));
    } else {
      out[off[2]] =
          convert<Out>(binary_int(op, convert<int64_t>(a[off[0]]), convert<int64_t>(b[off[1]])));
    }
  }
};

template <typename Bits>
struct WhereFn {
  const bool* cond;
  const Bits* a;
  const Bits* b;
  Bits* out;
  template <typename I>
  __device__ void operator()(const I (&off)[4]) const {
    out[off[3]] = cond[off[0]] ? a[off[1]] : b[off[2]];
  }
};

// Calls f(TypeTag<unsigned type of that many bytes>).
template <typename F>
void dispatch_bits(int element_size, F&& f) {
  switch (element_size) {
    case 1:
      return f(TypeTag<uint8_t>{});
    case 2:
      return f(TypeTag<uint16_t>{});
    case 4:
      return f(TypeTag<uint32_t>{});
    case 8:
      return f(TypeTag<uint64_t>{});
  }
  throw_internal("no element type of " + std::to_string(element_size) + " bytes");
}

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::kEq || op == BinaryOp::kNe || op == BinaryOp::kLt || op == BinaryOp::kLe ||
         op == BinaryOp::kGt || op == BinaryOp::kGe;
}

}  // namespace

void launch_copy(const Launch& l, const Indexer<2>& ix, int64_t numel, const void* src,
                 DType src_dtype, void* dst, DType dst_dtype) {
  dispatch_all(src_dtype, [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch_all(dst_dtype, [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      for_each_element(l, "copy", ix, numel,
                       CopyFn<In, Out>{static_cast<const In*>(src), static_cast<Out*>(dst)});
    });
  });
}

void launch_fill(const Launch& l, const Indexer<1>& ix, int64_t numel, void* dst, int element_size,
                 uint64_t bits) {
  dispatch_bits(element_size, [&](auto tag) {
    using Bits = typename decltype(tag)::type;
    for_each_element(l, "fill", ix, numel,
                     FillFn<Bits>{static_cast<Bits*>(dst), static_cast<Bits>(bits)});
  });
}

void launch_arange(const Launch& l, int64_t numel, void* dst, DType dtype, double start,
                   double step) {
  if (numel == 0) return;
  dispatch_all(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    arange_kernel<T>
        <<<grid_for(numel, l), kThreads, 0, l.stream>>>(static_cast<T*>(dst), numel, start, step);
  });
  check_launch("arange", l.device);
}

void launch_random(const Launch& l, int64_t numel, void* dst, DType dtype, RandomDistribution dist,
                   float a, float b, uint64_t seed, uint64_t offset) {
  if (numel == 0) return;
  dispatch_floating(dtype, "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T><<<grid_for(numel, l), kThreads, 0, l.stream>>>(static_cast<T*>(dst), numel,
                                                                    dist, a, b, seed, offset);
  });
  check_launch("random", l.device);
}

void launch_unary(const Launch& l, UnaryOp op, const Indexer<2>& ix, int64_t numel, const void* x,
                  DType x_dtype, void* out, DType out_dtype) {
  const bool integer_op = op == UnaryOp::kNeg || op == UnaryOp::kAbs || op == UnaryOp::kRelu ||
                          op == UnaryOp::kLogicalNot;
  if (!is_floating(x_dtype) && !integer_op) {
    throw_invalid_argument("unary op " + std::to_string(static_cast<int>(op)) +
                           " needs a floating-point tensor, got " +
                           std::string(dtype_name(x_dtype)));
  }
  dispatch_all(x_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (out_dtype == DType::kBool) {
      for_each_element(l, "unary", ix, numel,
                       UnaryFn<T, bool>{op, static_cast<const T*>(x), static_cast<bool*>(out)});
    } else {
      if (out_dtype != x_dtype) throw_internal("unary: output dtype differs from the input's");
      for_each_element(l, "unary", ix, numel,
                       UnaryFn<T, T>{op, static_cast<const T*>(x), static_cast<T*>(out)});
    }
  });
}

void launch_binary(const Launch& l, BinaryOp op, const Indexer<3>& ix, int64_t numel, const void* a,
                   const void* b, DType dtype, void* out, DType out_dtype) {
  const bool integer_op = op == BinaryOp::kAdd || op == BinaryOp::kSub || op == BinaryOp::kMul ||
                          op == BinaryOp::kMaximum || op == BinaryOp::kMinimum || is_comparison(op);
  if (!is_floating(dtype) && !integer_op) {
    throw_invalid_argument("binary op " + std::to_string(static_cast<int>(op)) +
                           " is not defined for dtype " + std::string(dtype_name(dtype)));
  }
  dispatch_all(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (is_comparison(op)) {
      if (out_dtype != DType::kBool) throw_internal("binary: a comparison into a non-bool output");
      for_each_element(l, "binary", ix, numel,
                       BinaryFn<T, bool>{op, static_cast<const T*>(a), static_cast<const T*>(b),
                                         static_cast<bool*>(out)});
    } else {
      for_each_element(l, "binary", ix, numel,
                       BinaryFn<T, T>{op, static_cast<const T*>(a), static_cast<const T*>(b),
                                      static_cast<T*>(out)});
    }
  });
}

void launch_where(const Launch& l, const Indexer<4>& ix, int64_t numel, const void* cond,
                  const void* a, const void* b, void* out, DType dtype) {
  dispatch_bits(static_cast<int>(dtype_size(dtype)), [&](auto tag) {
    using Bits = typename decltype(tag)::type;
    for_each_element(l, "where", ix, numel,
                     WhereFn<Bits>{static_cast<const bool*>(cond), static_cast<const Bits*>(a),
                                   static_cast<const Bits*>(b), static_cast<Bits*>(out)});
  });
}

}  // namespace tessel::cuda
