// The math backend on CUDA: attention the textbook way, one thread per output element and plain
// loops, f32 throughout — the reference the fused kernels are tested against, and the
// dispatcher's last resort. Scores and probabilities of a chunk of heads live in device
// scratch (S_q x S_k floats per head; chunks keep it near kScratchBytes). The per-element
// bodies come first (host-and-device functions, so tests run them on the CPU too), then the
// kernels and the launchers.

#include <cmath>
#include <cstdint>

#include "tessel/kernels/attention/cuda/internal/math_params.h"

namespace tessel::kernels::attention::cuda {

// ---- Element access ----------------------------------------------------------------------

TESSEL_HD float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

TESSEL_HD uint16_t float_to_half_bits(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // a subnormal half (or zero): round |f| * 2^24 to an integer
    const uint32_t shift = 126 - (abs >> 23);  // |f| * 2^24 = mantissa >> shift
    if (shift > 24) return static_cast<uint16_t>(sign);
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t q = man >> shift, rest = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    return static_cast<uint16_t>(sign | (q + (rest > halfway || (rest == halfway && (q & 1u)))));
  }
  // Normal: rebias and round to nearest even on the 13 dropped bits.
  const uint32_t base = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1fffu;
  const uint32_t rounded = base + (rest > 0x1000u || (rest == 0x1000u && (base & 1u)));
  return static_cast<uint16_t>(sign | rounded);
}

TESSEL_HD float load_value(const DeviceView& view, MathElem elem, int64_t offset) {
  switch (elem) {
    case MathElem::kF32:
      return static_cast<const float*>(view.data)[offset];
    case MathElem::kBf16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(view.data)[offset])
                            << 16;
      float f;
      __builtin_memcpy(&f, &bits, 4);
      return f;
    }
    case MathElem::kF16:
      return half_bits_to_float(static_cast<const uint16_t*>(view.data)[offset]);
  }
  return 0.0f;
}

TESSEL_HD void store_value(const DeviceView& view, MathElem elem, int64_t offset, float x) {
  switch (elem) {
    case MathElem::kF32:
      static_cast<float*>(view.data)[offset] = x;
      return;
    case MathElem::kBf16: {
      uint32_t u;
      __builtin_memcpy(&u, &x, 4);
      const uint16_t bits = (u & 0x7fffffffu) > 0x7f800000u
                                ? static_cast<uint16_t>((u >> 16) | 0x40u)  // NaN stays NaN
                                : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      static_cast<uint16_t*>(view.data)[offset] = bits;
      return;
    }
    case MathElem::kF16:
      static_cast<uint16_t*>(view.data)[offset] = float_to_half_bits(x);
      return;
  }
}

TESSEL_HD float at(const MathParams& p, const DeviceView& view, int b, int h, int s, int d) {
  return load_value(view, p.elem, view.offset(b, h, s) + d * view.stride_d);
}

// Where an index over (chunk heads, S_q, n) points: the query head (b, h), its key/value head
// hk, the query i, the last coordinate c, and the (chunk head, query) row.
struct MathPosition {
  int b, h, hk, i, c;
  int64_t row;
};
TESSEL_HD MathPosition math_position(const MathParams& p, int64_t idx, int n) {
  MathPosition pos;
  pos.c = static_cast<int>(idx % n);
  pos.row = idx / n;
  pos.i = static_cast<int>(pos.row % p.q_len);
  const int64_t bh = p.kv0 * p.group() + pos.row / p.q_len;
  pos.b = static_cast<int>(bh / p.q_heads);
  pos.h = static_cast<int>(bh % p.q_heads);
  pos.hk = pos.h / p.group();
  return pos;
}

// ---- Forward bodies ----------------------------------------------------------------------

// probs[hc, i, j] = scale q_i . k_j, or -inf where masked. idx over (chunk heads, S_q, S_k).
TESSEL_HD void math_scores_at(const MathParams& p, int64_t idx) {
  const MathPosition x = math_position(p, idx, p.kv_len);  // x.c is the key j
  float s = -INFINITY;
  if (visible(p.mask, x.b, x.h, x.i, x.c)) {
    float acc = 0;
    for (int d = 0; d < p.head_dim; ++d) {
      acc += at(p, p.q, x.b, x.h, x.i, d) * at(p, p.k, x.b, x.hk, x.c, d);
    }
    s = acc * p.scale;
  }
  p.probs[idx] = s;
}

// Softmax of one row in place, and its logsumexp. row over (chunk heads, S_q).
TESSEL_HD void math_softmax_row(const MathParams& p, int64_t row) {
  float* s = p.probs + row * p.kv_len;
  float m = -INFINITY;
  for (int j = 0; j < p.kv_len; ++j) m = fmaxf(m, s[j]);
  float lse = -INFINITY;
  if (m == -INFINITY) {
    for (int j = 0; j < p.kv_len; ++j) s[j] = 0;
  } else {
    float sum = 0;
    for (int j = 0; j < p.kv_len; ++j) sum += (s[j] = expf(s[j] - m));
    for (int j = 0; j < p.kv_len; ++j) s[j] /= sum;
    lse = m + logf(sum);
  }
  if (p.lse != nullptr) p.lse[p.kv0 * p.group() * p.q_len + row] = lse;
}

// The dropped-out probability of (hc, i, j).
TESSEL_HD float dropped(const MathParams& p, int b, int h, int i, int j, float prob) {
  if (p.dropout.threshold == 0) return prob;
  return dropout_keep(p.dropout, b, h, i, j) ? prob * p.dropout.keep_scale : 0.0f;
}

// out[b, h, i, d] = sum_j P_drop[i, j] v[j, d]. idx over (chunk heads, S_q, D).
TESSEL_HD void math_output_at(const MathParams& p, int64_t idx) {
  const MathPosition x = math_position(p, idx, p.head_dim);  // x.c is d
  const float* prob = p.probs + x.row * p.kv_len;
  float acc = 0;
  for (int j = 0; j < p.kv_len; ++j) {
    acc += dropped(p, x.b, x.h, x.i, j, prob[j]) * at(p, p.v, x.b, x.hk, j, x.c);
  }
  store_value(p.out, p.elem, p.out.offset(x.b, x.h, x.i) + x.c * p.out.stride_d, acc);
}

// ---- Backward bodies ---------------------------------------------------------------------

// grads[hc, i, j] = dP = (dO_i . v_j) through dropout. idx over (chunk heads, S_q, S_k).
TESSEL_HD void math_dprobs_at(const MathParams& p, int64_t idx) {
  const MathPosition x = math_position(p, idx, p.kv_len);  // x.c is the key j
  float acc = 0;
  for (int d = 0; d < p.head_dim; ++d) {
    acc += at(p, p.dout, x.b, x.h, x.i, d) * at(p, p.v, x.b, x.hk, x.c, d);
  }
  p.grads[idx] = dropped(p, x.b, x.h, x.i, x.c, acc);
}

// dS = P (dP - sum_j P dP) in place of dP. row over (chunk heads, S_q).
TESSEL_HD void math_dscores_row(const MathParams& p, int64_t row) {
  const float* prob = p.probs + row * p.kv_len;
  float* g = p.grads + row * p.kv_len;
  float dot = 0;
  for (int j = 0; j < p.kv_len; ++j) dot += prob[j] * g[j];
  for (int j = 0; j < p.kv_len; ++j) g[j] = prob[j] * (g[j] - dot);
}

// dq[b, h, i, d] = scale sum_j dS[i, j] k[j, d]. idx over (chunk heads, S_q, D).
TESSEL_HD void math_dq_at(const MathParams& p, int64_t idx) {
  const MathPosition x = math_position(p, idx, p.head_dim);  // x.c is d
  const float* g = p.grads + x.row * p.kv_len;
  float acc = 0;
  for (int j = 0; j < p.kv_len; ++j) acc += g[j] * at(p, p.k, x.b, x.hk, j, x.c);
  store_value(p.dq, p.elem, p.dq.offset(x.b, x.h, x.i) + x.c * p.dq.stride_d, acc * p.scale);
}

// dk, dv of key j: sums over the group's query heads and the queries. idx over (chunk kv heads,
// S_k, D).
TESSEL_HD void math_dkv_at(const MathParams& p, int64_t idx) {
  const int d = static_cast<int>(idx % p.head_dim);
  const int j = static_cast<int>((idx / p.head_dim) % p.kv_len);
  const int64_t kv_local = idx / (static_cast<int64_t>(p.head_dim) * p.kv_len);
  const int64_t bkv = p.kv0 + kv_local;
  const int b = static_cast<int>(bkv / p.kv_heads), hk = static_cast<int>(bkv % p.kv_heads);
  float dk = 0, dv = 0;
  for (int r = 0; r < p.group(); ++r) {
    const int64_t hc = kv_local * p.group() + r;
    const int h = hk * p.group() + r;
    const float* prob = p.probs + hc * p.q_len * p.kv_len + j;
    const float* g = p.grads + hc * p.q_len * p.kv_len + j;
    for (int i = 0; i < p.q_len; ++i) {
      const int64_t o = static_cast<int64_t>(i) * p.kv_len;
      dk += g[o] * at(p, p.q, b, h, i, d);
      dv += dropped(p, b, h, i, j, prob[o]) * at(p, p.dout, b, h, i, d);
    }
  }
  store_value(p.dk, p.elem, p.dk.offset(b, hk, j) + d * p.dk.stride_d, dk * p.scale);
  store_value(p.dv, p.elem, p.dv.offset(b, hk, j) + d * p.dv.stride_d, dv);
}

}  // namespace tessel::kernels::attention::cuda

#if defined(__CUDACC__)

#include "tessel/tensor/cuda/cuda_check.h"

namespace tessel::kernels::attention::cuda {
namespace {

constexpr int kThreads = 256;

enum class Body : uint8_t { kScores, kSoftmax, kOutput, kDprobs, kDscores, kDq, kDkv };

template <Body body>
__global__ void __launch_bounds__(kThreads) math_kernel(const MathParams p, int64_t n) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= n) return;
  if constexpr (body == Body::kScores) math_scores_at(p, idx);
  if constexpr (body == Body::kSoftmax) math_softmax_row(p, idx);
  if constexpr (body == Body::kOutput) math_output_at(p, idx);
  if constexpr (body == Body::kDprobs) math_dprobs_at(p, idx);
  if constexpr (body == Body::kDscores) math_dscores_row(p, idx);
  if constexpr (body == Body::kDq) math_dq_at(p, idx);
  if constexpr (body == Body::kDkv) math_dkv_at(p, idx);
}

template <Body body>
void launch(const MathParams& p, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  math_kernel<body><<<blocks, kThreads, 0, stream>>>(p, n);
  ::tessel::cuda::check_launch("math_kernel", ::tessel::cuda::current_device());
}

}  // namespace

void launch_math_forward(const MathParams& p, cudaStream_t stream) {
  const int64_t rows = p.chunk_heads() * p.q_len;
  launch<Body::kScores>(p, rows * p.kv_len, stream);
  launch<Body::kSoftmax>(p, rows, stream);
  launch<Body::kOutput>(p, rows * p.head_dim, stream);
}

void launch_math_backward(const MathParams& p, cudaStream_t stream) {
  const int64_t rows = p.chunk_heads() * p.q_len;
  launch<Body::kScores>(p, rows * p.kv_len, stream);
  launch<Body::kSoftmax>(p, rows, stream);
  launch<Body::kDprobs>(p, rows * p.kv_len, stream);
  launch<Body::kDscores>(p, rows, stream);
  launch<Body::kDq>(p, rows * p.head_dim, stream);
  launch<Body::kDkv>(p, p.kv_count * p.kv_len * p.head_dim, stream);
}

}  // namespace tessel::kernels::attention::cuda

#endif  // __CUDACC__
