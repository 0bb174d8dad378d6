// The cuDNN backend's rules, graph keys and fallback record (no cuDNN headers; every build).
#include "tessel/kernels/attention/cudnn/cudnn_sdpa_support.h"

#include <fmt/format.h>

#include <algorithm>

#include "tessel/base/logging.h"

namespace tessel::kernels::attention {
namespace {

std::vector<int64_t> dims_of(const AttentionView& v) {
  return {v.sizes[0], v.sizes[1], v.sizes[2], v.sizes[3]};
}

std::string version_str(int64_t v) {
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

}  // namespace

std::string cudnn_view_reason(const AttentionView& v, const char* name) {
  if (v.strides[3] != 1 && v.head_dim() > 1) {
    return fmt::format("{} has stride {} along D; cudnn needs a contiguous last dimension", name,
                       v.strides[3]);
  }
  for (int d = 0; d < 3; ++d) {
    if (v.strides[d] % 8 != 0 && v.sizes[d] > 1) {
      return fmt::format("{} has stride {} along dim {}; cudnn needs 16-byte aligned rows", name,
                         v.strides[d], d);
    }
  }
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) {
    return fmt::format("{} is not 16-byte aligned; cudnn needs 16-byte aligned rows", name);
  }
  return {};
}

std::string_view sdpa_direction_name(SdpaDirection direction) {
  return direction == SdpaDirection::kForward ? "forward" : "backward";
}

int64_t cudnn_deterministic_workspace_bytes(const AttentionProblem& p) {
  const int64_t sq = (p.q_len() + 63) / 64 * 64, sk = (p.kv_len() + 127) / 128 * 128;
  return p.batch() * p.q_heads() * sq * sk * 2;
}

CudnnBand cudnn_band_of(const AttentionProblem& p) {
  CudnnBand band;
  band.left = p.mask.window_left;
  band.right = p.mask.window_right;
  if (p.mask.causal) band.right = band.right < 0 ? 0 : std::min<int64_t>(band.right, 0);
  band.bottom_right = p.mask.alignment == MaskAlignment::kBottomRight;
  return band;
}

std::string cudnn_sdpa_rule_reason(const AttentionProblem& p, const CudnnEnvironment& env,
                                   SdpaDirection direction) {
  if (!p.q.device.is_cuda()) {
    return fmt::format("tensors are on {}; cudnn runs CUDA tensors", p.q.device.str());
  }
  const int cc = env.compute_capability;
  if (cc < 80) {
    return cc == 0 ? fmt::format("cannot read the compute capability of {}", p.q.device.str())
                   : fmt::format("{} is sm_{}; cuDNN's fused attention needs sm_80 or newer",
                                 p.q.device.str(), cc);
  }
  if (env.cudnn_version < 90000) {
    return fmt::format("cuDNN {} is loaded; this backend needs cuDNN 9", env.cudnn_version);
  }
  if (p.q.dtype != DType::kBF16 && p.q.dtype != DType::kF16) {
    return fmt::format("dtype {}; cudnn supports bf16 and f16", dtype_name(p.q.dtype));
  }
  const int64_t d = p.head_dim();
  if (d < 8 || d > 128 || d % 8 != 0) {
    return fmt::format("head dim {}; cudnn supports head dims 8 to 128 that are multiples of 8", d);
  }
  if (p.q_len() == 0 || p.kv_len() == 0 || p.batch() == 0 || p.q_heads() == 0) {
    return "an empty sequence, batch or head count; cudnn needs every size >= 1";
  }
  for (const auto& [view, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}}) {
    std::string why = cudnn_view_reason(*view, name);
    if (!why.empty()) return why;
  }
  const AttentionMask& m = p.mask;
  if (!m.prefix_lengths.empty() || m.has_documents() || m.mask_fn) {
    return "prefix lengths, documents or a mask predicate; cudnn supports causal masks and "
           "sliding windows (flash_cuda runs the rest)";
  }
  if (p.dropout.p > 0) {
    return "dropout; cuDNN draws its own dropout mask, unlike every other backend (flash_cuda "
           "runs it)";
  }
  // Window conventions: cuDNN's band needs a right bound (causal or window_right) under a left
  // one, and S_q <= S_k with a bottom-right band or any left bound.
  const CudnnBand band = cudnn_band_of(p);
  if (band.left >= 0 && band.right < 0) {
    return "a left window without a right bound; cudnn needs causal or window_right with a "
           "window_left";
  }
  if (band.right >= 0 && band.bottom_right && p.q_len() > p.kv_len()) {
    return fmt::format("a bottom-right mask with S_q {} > S_k {}; cudnn needs S_q <= S_k there",
                       p.q_len(), p.kv_len());
  }
  if (band.left >= 0 && p.q_len() > p.kv_len()) {
    return fmt::format("a sliding window with S_q {} > S_k {}; cudnn needs S_q <= S_k there",
                       p.q_len(), p.kv_len());
  }
  if (band.right >= 0 && band.bottom_right && env.cudnn_version < 90600 &&
      (p.q_len() % 64 != 0 || p.kv_len() % 64 != 0)) {
    return fmt::format(
        "a bottom-right mask with S_q {} and S_k {}; cuDNN {} needs multiples of 64 there (9.6 "
        "does not)",
        p.q_len(), p.kv_len(), version_str(env.cudnn_version));
  }
  if (direction == SdpaDirection::kBackward && p.deterministic) {
    if (cc >= 100 && env.cudnn_version < 91800) {
      return fmt::format(
          "a deterministic backward on sm_{}; cuDNN {} has none there (9.18 does), flash_cuda's "
          "runs everywhere",
          cc, version_str(env.cudnn_version));
    }
    const int64_t bytes = cudnn_deterministic_workspace_bytes(p);
    if (bytes > kCudnnDeterministicWorkspaceLimit) {
      return fmt::format(
          "a deterministic backward; cuDNN's needs a {} MiB S_q x S_k workspace here (limit {} "
          "MiB), flash_cuda's needs none",
          bytes >> 20, kCudnnDeterministicWorkspaceLimit >> 20);
    }
  }
  return {};
}

std::vector<int64_t> cudnn_strides_of(const AttentionView& v) {
  return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}

std::vector<int64_t> dense_strides_like(const AttentionView& v) {
  std::array<int, 4> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return v.strides[a] > v.strides[b]; });
  std::vector<int64_t> strides(4);
  int64_t stride = 1;
  for (int k = 3; k >= 0; --k) {
    strides[order[k]] = stride;
    stride *= v.sizes[order[k]];
  }
  return strides;
}

CudnnBackwardStrides dense_backward_strides(const AttentionProblem& p) {
  const std::vector<int64_t> out = dense_strides_like(p.q);
  return {out, out, out, dense_strides_like(p.k), dense_strides_like(p.v)};
}

CudnnGraphKey cudnn_forward_graph_key(const AttentionProblem& p,
                                      const std::vector<int64_t>& out_strides) {
  CudnnGraphKey key;
  key.device = p.q.device.index;
  key.dtype = p.q.dtype;
  key.q_dims = dims_of(p.q);
  key.kv_dims = dims_of(p.k);
  key.strides = {cudnn_strides_of(p.q), cudnn_strides_of(p.k), cudnn_strides_of(p.v), out_strides};
  key.band = cudnn_band_of(p);
  key.scale = static_cast<float>(p.softmax_scale());
  return key;
}

CudnnGraphKey cudnn_backward_graph_key(const AttentionProblem& p, const CudnnBackwardStrides& s) {
  CudnnGraphKey key = cudnn_forward_graph_key(p, s.out);
  key.direction = SdpaDirection::kBackward;
  key.strides.insert(key.strides.end(), {s.dout, s.dq, s.dk, s.dv});
  key.deterministic = p.deterministic;
  return key;
}

std::string cudnn_graph_key_str(const CudnnGraphKey& k) {
  return fmt::format("{} {} q ({}, {}, {}, {}) kv ({}, {}, {}, {}) band ({}, {}){}{}",
                     sdpa_direction_name(k.direction), dtype_name(k.dtype), k.q_dims[0],
                     k.q_dims[1], k.q_dims[2], k.q_dims[3], k.kv_dims[0], k.kv_dims[1],
                     k.kv_dims[2], k.kv_dims[3], k.band.left, k.band.right,
                     k.band.bottom_right ? " bottom-right" : "",
                     k.deterministic ? " deterministic" : "");
}

// ---- The fallback record ---------------------------------------------------------------------

namespace {

struct FallbackRecord {
  static constexpr size_t kMaxDistinct = 64;
  std::mutex mu;
  std::vector<CudnnFallback> seen;
};

FallbackRecord& fallback_record() {
  static auto* r = new FallbackRecord();  // never destroyed: calls may run during exit
  return *r;
}

}  // namespace

void record_cudnn_sdpa_fallback(SdpaDirection direction, std::string_view call,
                                std::string_view reason) {
  FallbackRecord& r = fallback_record();
  std::lock_guard<std::mutex> lock(r.mu);
  for (CudnnFallback& f : r.seen) {
    if (f.direction == direction && f.reason == reason) {
      ++f.count;
      return;
    }
  }
  if (r.seen.size() == FallbackRecord::kMaxDistinct) {
    ++r.seen.back().count;
    return;
  }
  r.seen.push_back({direction, std::string(reason), std::string(call), 1});
  const std::string more = r.seen.size() == FallbackRecord::kMaxDistinct
                               ? " (the last reason logged; cudnn_sdpa_fallbacks() counts the rest)"
                               : "";
  // A forward declined is routing (the dispatcher's choice, at info); a backward declined after
  // cuDNN ran the forward is worth seeing by default.
  if (direction == SdpaDirection::kForward) {
    log_info(LogComponent::kKernels, "cudnn declined the forward of {}: {}; flash_cuda runs it{}",
             call, reason, more);
  } else {
    log_warn(LogComponent::kKernels,
             "cudnn declined the backward of {}: {}; flash_cuda runs it (once per reason){}", call,
             reason, more);
  }
}

std::vector<CudnnFallback> cudnn_sdpa_fallbacks() {
  FallbackRecord& r = fallback_record();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.seen;
}

}  // namespace tessel::kernels::attention
