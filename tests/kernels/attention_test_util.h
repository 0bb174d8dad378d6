#pragma once
// Helpers for the attention tests: random (B, H, S, D) buffers, views over them, and error
// measures.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "tessel/kernels/attention/attention_problem.h"
#include "tessel/tensor/dtype.h"

namespace tessel::kernels::attention::testing {

// A contiguous (B, H, S, D) buffer in f32 or bf16 (bf16 kept as raw bits).
struct Buffer {
  DType dtype = DType::kF32;
  int64_t sizes[4] = {0, 0, 0, 0};
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Buffer(DType dt, int64_t b, int64_t h, int64_t s, int64_t d) : dtype(dt), sizes{b, h, s, d} {
    const auto n = static_cast<size_t>(b * h * s * d);
    if (dt == DType::kF32)
      f32.assign(n, 0.0f);
    else
      bf16.assign(n, 0);
  }
  int64_t numel() const { return sizes[0] * sizes[1] * sizes[2] * sizes[3]; }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  AttentionView view() { return attention_view(data(), dtype, sizes); }
  float at(int64_t i) const {
    if (dtype == DType::kF32) return f32[i];
    BFloat16 x;
    x.bits = bf16[i];
    return static_cast<float>(x);
  }
  void set(int64_t i, float x) {
    if (dtype == DType::kF32)
      f32[i] = x;
    else
      bf16[i] = BFloat16::from_float(x);
  }
  std::vector<float> values() const {
    std::vector<float> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = at(i);
    return out;
  }
};

inline void fill_normal(Buffer& buf, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < buf.numel(); ++i) buf.set(i, dist(gen));
}

// Random q (B, H_q, S_q, D), k and v (B, H_kv, S_k, D) and an output gradient like q.
struct Qkv {
  Buffer q, k, v, dout;
  Qkv(DType dt, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
      uint32_t seed)
      : q(dt, b, hq, sq, d), k(dt, b, hkv, sk, d), v(dt, b, hkv, sk, d), dout(dt, b, hq, sq, d) {
    fill_normal(q, seed);
    fill_normal(k, seed + 1);
    fill_normal(v, seed + 2);
    fill_normal(dout, seed + 3);
  }
  // An unmasked problem over q, k, v.
  AttentionProblem problem() {
    AttentionProblem p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    return p;
  }
};

// max_i |a_i - b_i|; NaN anywhere counts as infinite error.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}
// The same with matching infinities counted as equal (fully masked rows' logsumexp is -inf).
inline double max_abs_diff_inf(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}
inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

// The mask kinds the sweeps cover.
enum class MaskKind {
  kNone,
  kCausalTopLeft,
  kCausalBottomRight,
  kWindow,
  kWindowBottomRight,
  kPrefixLm,
  kDocuments,
  kMaskFn,
  kFullyMaskedRows,
  kDropout,
  kCount
};

inline const char* mask_kind_name(MaskKind k) {
  switch (k) {
    case MaskKind::kNone:
      return "None";
    case MaskKind::kCausalTopLeft:
      return "CausalTopLeft";
    case MaskKind::kCausalBottomRight:
      return "CausalBottomRight";
    case MaskKind::kWindow:
      return "Window";
    case MaskKind::kWindowBottomRight:
      return "WindowBottomRight";
    case MaskKind::kPrefixLm:
      return "PrefixLm";
    case MaskKind::kDocuments:
      return "Documents";
    case MaskKind::kMaskFn:
      return "MaskFn";
    case MaskKind::kFullyMaskedRows:
      return "FullyMaskedRows";
    case MaskKind::kDropout:
      return "Dropout";
    case MaskKind::kCount:
      break;
  }
  return "?";
}

// Document ids: runs of varying length (1, 5, 9, ... tokens), the same for q and kv when the
// lengths match; with S_q != S_k the query ids are the last S_q key ids (bottom-right).
inline std::vector<int64_t> document_ids(int64_t n) {
  std::vector<int64_t> ids(n);
  int64_t doc = 0, left = 1;
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = doc;
    if (--left == 0) left = 1 + 4 * ++doc;
  }
  return ids;
}

// Sets p's mask (and dropout) to the kind's pattern for the batch size and lengths.
inline void configure_mask(MaskKind kind, int64_t batch, int64_t sq, int64_t sk,
                           AttentionProblem& p) {
  AttentionMask& m = p.mask;
  switch (kind) {
    case MaskKind::kNone:
      break;
    case MaskKind::kCausalTopLeft:
      m.causal = true;
      break;
    case MaskKind::kCausalBottomRight:
      m.causal = true;
      m.alignment = MaskAlignment::kBottomRight;
      break;
    case MaskKind::kWindow:
      m.window_left = 9;
      m.window_right = 3;
      break;
    case MaskKind::kWindowBottomRight:
      m.causal = true;
      m.window_left = 70;
      m.alignment = MaskAlignment::kBottomRight;
      break;
    case MaskKind::kPrefixLm:
      m.causal = true;
      m.prefix_lengths.resize(batch);
      for (int64_t b = 0; b < batch; ++b) m.prefix_lengths[b] = (sk * (b + 1)) / 4;
      break;
    case MaskKind::kDocuments: {
      m.causal = true;
      m.alignment = MaskAlignment::kBottomRight;
      const std::vector<int64_t> kv = document_ids(sk);
      m.kv_document_ids = kv;
      for (int64_t i = 0; i < sq; ++i) {
        // Query i sits at key position i + S_k - S_q; positions before 0 get their own id.
        const int64_t pos = i + sk - sq;
        m.q_document_ids.push_back(pos >= 0 ? kv[pos] : -1 - i);
      }
      break;
    }
    case MaskKind::kMaskFn:
      // A head-dependent dilated pattern: key j visible when (i + j + h) % 3 != 0.
      m.mask_fn = [](int64_t, int64_t h, int64_t i, int64_t j) { return (i + j + h) % 3 != 0; };
      break;
    case MaskKind::kFullyMaskedRows:
      // Even query rows of even batch entries see nothing; with S_q > S_k the bottom-right
      // rows before the first key see nothing either.
      m.causal = true;
      m.alignment = MaskAlignment::kBottomRight;
      m.mask_fn = [](int64_t b, int64_t, int64_t i, int64_t) { return b % 2 == 1 || i % 2 == 1; };
      break;
    case MaskKind::kDropout:
      m.causal = true;
      p.dropout = {0.2, 1234, 77};
      break;
    case MaskKind::kCount:
      break;
  }
}

// One case of the kernel sweeps: dtype, batch, query and key/value heads, lengths, head dim,
// mask; named "bf16_B2_Hq4_Hkv2_Sq129_Sk257_D64_Causal" in test names.
struct KernelCase {
  DType dtype;
  int64_t b, hq, hkv, sq, sk, d;
  MaskKind mask;
};

inline void PrintTo(const KernelCase& c, std::ostream* os) {
  *os << fmt::format("{} B{} Hq{} Hkv{} Sq{} Sk{} D{} {}", dtype_name(c.dtype), c.b, c.hq, c.hkv,
                     c.sq, c.sk, c.d, mask_kind_name(c.mask));
}

inline std::string kernel_case_name(const ::testing::TestParamInfo<KernelCase>& info) {
  const KernelCase& c = info.param;
  return fmt::format("{}_B{}_Hq{}_Hkv{}_Sq{}_Sk{}_D{}_{}", dtype_name(c.dtype), c.b, c.hq, c.hkv,
                     c.sq, c.sk, c.d, mask_kind_name(c.mask));
}

}  // namespace tessel::kernels::attention::testing
