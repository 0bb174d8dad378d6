#pragma once
// The host side of the cuDNN backend, free of cuDNN and CUDA headers (built and tested in every
// build): which calls cuDNN's fused attention takes — the rules known without a graph, per
// direction, then the support check of the direction's graph — the graphs' keys, the cache that
// builds a direction's graph only when that direction first runs (a forward-only call never
// builds a backward graph), and the record of calls cuDNN declined that flash_cuda ran instead.
//
//   CudnnSdpaGraphs<MyGraph> graphs(256, build);       // MyGraph has `std::string error`
//   std::string why = graphs.forward_reason(p, env, dense_strides_like(p.q));
//   if (!why.empty()) record_cudnn_sdpa_fallback(SdpaDirection::kForward, call, why);

#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/base/lru_cache.h"
#include "tessel/kernels/attention/attention_problem.h"

namespace tessel::kernels::attention {

enum class SdpaDirection : uint8_t { kForward, kBackward };
std::string_view sdpa_direction_name(SdpaDirection direction);  // "forward", "backward"

// What cuDNN's attention depends on beside the problem: the device's compute capability
// (90 for sm_90; 0 when unknown) and the loaded cuDNN (cudnnGetVersion(): 91900 for 9.19.0).
struct CudnnEnvironment {
  int compute_capability = 0;
  int64_t cudnn_version = 0;
};

// cuDNN runs a deterministic backward with a dP workspace of about 2 bytes per (batch, query
// head, query, key) — S_q x S_k memory; above this many bytes the backward goes to flash_cuda,
// whose deterministic backward needs none.
inline constexpr int64_t kCudnnDeterministicWorkspaceLimit = int64_t{1} << 30;

// The bytes of that workspace for `problem` (cudnn-frontend pads S_q to 64 and S_k to 128).
int64_t cudnn_deterministic_workspace_bytes(const AttentionProblem& problem);

// Empty when cuDNN's documented rules let it run `problem` (validated) in `direction` on
// `env`, else the reason, naming what cuDNN supports. Pure: reads no device. The graph's own
// support check can still decline (CudnnSdpaGraphs asks it).
std::string cudnn_sdpa_rule_reason(const AttentionProblem& problem, const CudnnEnvironment& env,
                                   SdpaDirection direction);

// Empty when cuDNN can read or write `view` in place: a contiguous last dimension and 16-byte
// aligned rows; else the reason, naming the tensor as `name`.
std::string cudnn_view_reason(const AttentionView& view, const char* name);

// The mask in cuDNN's terms: a diagonal band around the aligned position. cuDNN keeps key j of
// query i when j <= p + right_bound and j > p - left_bound (p the aligned position), so our
// window (left w) is its left_bound w + 1.
struct CudnnBand {
  int64_t left = -1;   // ours: keys before the position; -1 unbounded
  int64_t right = -1;  // ours: keys after it; -1 unbounded
  bool bottom_right = false;
  auto operator<=>(const CudnnBand&) const = default;
};
CudnnBand cudnn_band_of(const AttentionProblem& problem);

// Everything a graph depends on. A forward and a backward graph never share a key.
struct CudnnGraphKey {
  int device = 0;
  SdpaDirection direction = SdpaDirection::kForward;
  DType dtype = DType::kBF16;
  std::vector<int64_t> q_dims, kv_dims;
  std::vector<std::vector<int64_t>> strides;  // q, k, v, out (backward: then dout, dq, dk, dv)
  CudnnBand band;
  float scale = 1.0f;
  bool deterministic = false;  // backward only
  auto operator<=>(const CudnnGraphKey&) const = default;
};

// The strides of the backward's tensors beyond q, k, v.
struct CudnnBackwardStrides {
  std::vector<int64_t> out, dout, dq, dk, dv;
};

std::vector<int64_t> cudnn_strides_of(const AttentionView& view);
// Strides of a dense tensor shaped like `view` with its dims in memory in view's order of
// decreasing stride: how scaled_dot_product_attention lays out outputs and gradients.
std::vector<int64_t> dense_strides_like(const AttentionView& view);
// The strides scaled_dot_product_attention gives the backward's tensors for `problem`.
CudnnBackwardStrides dense_backward_strides(const AttentionProblem& problem);

CudnnGraphKey cudnn_forward_graph_key(const AttentionProblem& problem,
                                      const std::vector<int64_t>& out_strides);
CudnnGraphKey cudnn_backward_graph_key(const AttentionProblem& problem,
                                       const CudnnBackwardStrides& strides);
// "backward bf16 q (2, 8, 128, 64) kv (2, 2, 128, 64) band (-1, 0) deterministic".
std::string cudnn_graph_key_str(const CudnnGraphKey& key);

// The graphs of every call, built per direction on first use and cached (bounded, least
// recently used first out: variable shapes would otherwise grow it without end; a caller still
// holding a graph keeps it alive). A failed build is cached too, so a shape cuDNN declines is
// asked about once while cached. Graph is the caller's type with a `std::string error` member,
// empty when the build succeeded. Thread-safe; the builder runs outside the lock (two threads
// may build one key; the first stored is kept).
template <class Graph>
class CudnnSdpaGraphs {
 public:
  using Builder = std::function<std::shared_ptr<Graph>(const CudnnGraphKey&)>;

  CudnnSdpaGraphs(size_t capacity, Builder build) : cache_(capacity), build_(std::move(build)) {}

  // The graph of `key`: cached, or built now.
  std::shared_ptr<Graph> graph(const CudnnGraphKey& key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto* found = cache_.find(key)) return *found;
    }
    std::shared_ptr<Graph> built = build_(key);
    std::lock_guard<std::mutex> lock(mu_);
    ++builds_[static_cast<int>(key.direction)];
    return cache_.insert(key, std::move(built));
  }

  // Empty when cuDNN runs the forward of `problem` with output strides `out`: the rules, then
  // the forward graph's support check (building that graph, and only that one, if new).
  std::string forward_reason(const AttentionProblem& problem, const CudnnEnvironment& env,
                             const std::vector<int64_t>& out) {
    std::string why = cudnn_sdpa_rule_reason(problem, env, SdpaDirection::kForward);
    if (!why.empty()) return why;
    return graph_reason(cudnn_forward_graph_key(problem, out));
  }

  // The same for the backward with the given gradient layouts (building the backward graph).
  std::string backward_reason(const AttentionProblem& problem, const CudnnEnvironment& env,
                              const CudnnBackwardStrides& strides) {
    std::string why = cudnn_sdpa_rule_reason(problem, env, SdpaDirection::kBackward);
    if (!why.empty()) return why;
    return graph_reason(cudnn_backward_graph_key(problem, strides));
  }

  // How many graphs of `direction` were built (a failed build counts).
  int64_t builds(SdpaDirection direction) const {
    std::lock_guard<std::mutex> lock(mu_);
    return builds_[static_cast<int>(direction)];
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.size();
  }

 private:
  std::string graph_reason(const CudnnGraphKey& key) {
    const std::shared_ptr<Graph> g = graph(key);
    if (g->error.empty()) return {};
    return "cuDNN declines this " + cudnn_graph_key_str(key) + ": " + g->error;
  }

  mutable std::mutex mu_;
  LruCache<CudnnGraphKey, std::shared_ptr<Graph>> cache_;
  Builder build_;
  std::array<int64_t, 2> builds_{};
};

// One kind of call cuDNN declined and flash_cuda ran: the direction, cuDNN's reason, the first
// such call ("bf16 q (...) kv (...) causal on cuda:0") and how many calls so far.
struct CudnnFallback {
  SdpaDirection direction = SdpaDirection::kForward;
  std::string reason;
  std::string first_call;
  int64_t count = 0;
};

// Records that a call cuDNN declined ran on flash_cuda. Each distinct (direction, reason) is
// logged once (component kernels; forward at info, backward at warn) and counted; at most 64
// distinct ones are kept, the rest counted under the last. Thread-safe.
void record_cudnn_sdpa_fallback(SdpaDirection direction, std::string_view call,
                                std::string_view reason);

// The fallbacks recorded in this process, in the order first seen. Thread-safe.
std::vector<CudnnFallback> cudnn_sdpa_fallbacks();

}  // namespace tessel::kernels::attention
