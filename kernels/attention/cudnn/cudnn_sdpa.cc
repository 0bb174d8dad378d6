// The cuDNN backend: cudnn-frontend graphs for scaled dot-product attention, built once per
// (device, shapes, strides, mask, scale, direction) and cached; every cuDNN and frontend call
// checked and turned into a tessel error that names it.
#include "tessel/kernels/attention/cudnn/cudnn_sdpa.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <compare>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/kernels/attention/cuda/flash_cuda.h"
#include "tessel/kernels/attention/internal/lru_cache.h"
#include "tessel/tensor/cuda/cuda_check.h"
#include "tessel/tensor/stream.h"
#include "tessel/tensor/tensor.h"

namespace tessel::kernels::attention {
namespace {

namespace fe = cudnn_frontend;

// Variant-pack ids of the graphs' tensors.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) [[likely]]
    return;
  throw Internal(fmt::format("{} failed: {} ({})", call, cudnnGetErrorString(status),
                             static_cast<int>(status)));
}

// cuDNN handles are used by one thread at a time: one per thread and device, destroyed with the
// thread.
struct HandleDeleter {
  void operator()(cudnnHandle_t h) const { cudnnDestroy(h); }
};
using Handle = std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, HandleDeleter>;

cudnnHandle_t thread_handle(int device) {
  thread_local std::map<int, Handle> handles;
  Handle& h = handles[device];
  if (!h) {
    cudnnHandle_t raw = nullptr;
    check_cudnn(cudnnCreate(&raw), "cudnnCreate");
    h.reset(raw);
  }
  return h.get();
}

// The mask in cuDNN's terms: a diagonal band around the aligned position. cuDNN keeps key j of
// query i when j <= p + right_bound and j > p - left_bound (p the aligned position), so our
// window (left w) is its left_bound w + 1.
struct Band {
  int64_t left = -1;   // ours: keys before the position; -1 unbounded
  int64_t right = -1;  // ours: keys after it; -1 unbounded
  bool bottom_right = false;
  auto operator<=>(const Band&) const = default;
};

Band band_of(const AttentionProblem& p) {
  Band band;
  band.left = p.mask.window_left;
  band.right = p.mask.window_right;
  if (p.mask.causal) band.right = band.right < 0 ? 0 : std::min<int64_t>(band.right, 0);
  band.bottom_right = p.mask.alignment == MaskAlignment::kBottomRight;
  return band;
}

std::vector<int64_t> dims_of(const AttentionView& v) {
  return {v.sizes[0], v.sizes[1], v.sizes[2], v.sizes[3]};
}
std::vector<int64_t> strides_of(const AttentionView& v) {
  return {v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}
// Strides of a dense tensor shaped like `v` with its dims in memory in v's order of decreasing
// stride: how scaled_dot_product_attention lays out outputs and gradients (sdpa.cc).
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

// Everything a graph depends on.
struct GraphKey {
  int device = 0;
  bool backward = false;
  DType dtype = DType::kBF16;
  std::vector<int64_t> q_dims, kv_dims;
  std::vector<std::vector<int64_t>> strides;  // q, k, v, out (then dout, dq, dk, dv)
  Band band;
  float scale = 1.0f;
  bool deterministic = false;
  auto operator<=>(const GraphKey&) const = default;
};

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null when the build failed
  int64_t workspace_bytes = 0;
  std::string error;  // why the build failed
  std::mutex run;     // one execute at a time per graph object
};

std::string key_str(const GraphKey& k) {
  return fmt::format("{} {} q ({}, {}, {}, {}) kv ({}, {}, {}, {}) band ({}, {}){}",
                     k.backward ? "backward" : "forward", dtype_name(k.dtype), k.q_dims[0],
                     k.q_dims[1], k.q_dims[2], k.q_dims[3], k.kv_dims[0], k.kv_dims[1],
                     k.kv_dims[2], k.kv_dims[3], k.band.left, k.band.right,
                     k.band.bottom_right ? " bottom-right" : "");
}

// Builds the graph of `key`; returns the frontend's error message instead of throwing.
std::shared_ptr<CachedGraph> build_graph(const GraphKey& key, cudnnHandle_t handle) {
  auto cached = std::make_shared<CachedGraph>();
  auto graph = std::make_shared<fe::graph::Graph>();
  graph
      ->set_io_data_type(key.dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16
                                                   : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, const std::vector<int64_t>& dims,
                    const std::vector<int64_t>& strides) {
    return graph->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
            strides));
  };
  const std::vector<int64_t>& qd = key.q_dims;
  const std::vector<int64_t> stats_dims = {qd[0], qd[1], qd[2], 1};
  const std::vector<int64_t> stats_strides = {qd[1] * qd[2], qd[2], 1, 1};
  auto q = tensor("q", kQ, qd, key.strides[0]);
  auto k = tensor("k", kK, key.kv_dims, key.strides[1]);
  auto v = tensor("v", kV, key.kv_dims, key.strides[2]);
  auto set_band = [&](auto& attributes) {
    if (key.band.right < 0) return;
    attributes.set_diagonal_alignment(key.band.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                            : fe::DiagonalAlignment_t::TOP_LEFT);
    attributes.set_diagonal_band_right_bound(static_cast<int>(key.band.right));
    if (key.band.left >= 0)
      attributes.set_diagonal_band_left_bound(static_cast<int>(key.band.left + 1));
  };
  if (!key.backward) {
    auto options =
        fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(
            key.scale);
    set_band(options);
    auto [o, stats] = graph->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(qd).set_stride(key.strides[3]);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dims)
        .set_stride(stats_strides);
  } else {
    auto o = tensor("o", kO, qd, key.strides[3]);
    auto dout = tensor("dout", kDout, qd, key.strides[4]);
    auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(kStats)
                                   .set_dim(stats_dims)
                                   .set_stride(stats_strides)
                                   .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_attn_scale(key.scale)
                       .set_deterministic_algorithm(key.deterministic);
    set_band(options);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, options);
    dq->set_output(true).set_uid(kDq).set_dim(qd).set_stride(key.strides[5]);
    dk->set_output(true).set_uid(kDk).set_dim(key.kv_dims).set_stride(key.strides[6]);
    dv->set_output(true).set_uid(kDv).set_dim(key.kv_dims).set_stride(key.strides[7]);
  }
  // Each step's failure is kept with the step's name.
  const std::pair<const char*, std::function<fe::error_t()>> steps[] = {
      {"validate", [&] { return graph->validate(); }},
      {"build_operation_graph", [&] { return graph->build_operation_graph(handle); }},
      {"create_execution_plans",
       [&] { return graph->create_execution_plans({fe::HeurMode_t::A}); }},
      {"check_support", [&] { return graph->check_support(handle); }},
      {"build_plans", [&] { return graph->build_plans(); }},
      {"get_workspace_size", [&] { return graph->get_workspace_size(cached->workspace_bytes); }},
  };
  for (const auto& [name, step] : steps) {
    fe::error_t status = step();
    if (!status.is_good()) {
      cached->error = fmt::format("cudnn-frontend {} failed: {}", name, status.get_message());
      return cached;
    }
  }
  cached->graph = std::move(graph);
  if (log_enabled(LogComponent::kKernels, LogLevel::kDebug)) {
    std::string plan;
    if (cached->graph->get_plan_name(plan).is_good()) {
      log_debug(LogComponent::kKernels, "cudnn: built a graph for {}: plan {}, workspace {} bytes",
                key_str(key), plan, cached->workspace_bytes);
    }
  }
  return cached;
}

// The process-wide graph cache (one of the documented singletons; never destroyed, since
// calls may run during exit), bounded: variable shapes would otherwise grow it without end. The
// least recently used graph is forgotten first; a caller still holding it keeps it alive.
// Failed builds are cached too, so a shape cuDNN cannot run is asked about once while cached.
constexpr size_t kMaxCachedGraphs = 256;

std::shared_ptr<CachedGraph> graph_for(const GraphKey& key) {
  static std::mutex mu;
  static auto* cache = new LruCache<GraphKey, std::shared_ptr<CachedGraph>>(kMaxCachedGraphs);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto* found = cache->find(key)) return *found;
  }
  std::shared_ptr<CachedGraph> built = build_graph(key, thread_handle(key.device));
  std::lock_guard<std::mutex> lock(mu);
  return cache->insert(key, std::move(built));  // keeps a racing thread's graph
}

GraphKey forward_key(const AttentionProblem& p, const std::vector<int64_t>& out_strides) {
  GraphKey key;
  key.device = p.q.device.index;
  key.dtype = p.q.dtype;
  key.q_dims = dims_of(p.q);
  key.kv_dims = dims_of(p.k);
  key.strides = {strides_of(p.q), strides_of(p.k), strides_of(p.v), out_strides};
  key.band = band_of(p);
  key.scale = static_cast<float>(p.softmax_scale());
  return key;
}

GraphKey backward_key(const AttentionProblem& p, const std::vector<int64_t>& out,
                      const std::vector<int64_t>& dout, const std::vector<int64_t>& dq,
                      const std::vector<int64_t>& dk, const std::vector<int64_t>& dv) {
  GraphKey key = forward_key(p, out);
  key.backward = true;
  key.strides.insert(key.strides.end(), {dout, dq, dk, dv});
  key.deterministic = p.deterministic;
  return key;
}

std::string view_reason(const AttentionView& v, const char* name) {
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

// The checks that need no graph: what this backend maps onto cuDNN's attention at all.
std::string static_reason(const AttentionProblem& p) {
  if (!p.q.device.is_cuda()) {
    return fmt::format("tensors are on {}; cudnn runs CUDA tensors", p.q.device.str());
  }
  const int cc = cuda_compute_capability(p.q.device.index);
  if (cc < 80) {
    return cc == 0 ? fmt::format("cannot read the compute capability of {}", p.q.device.str())
                   : fmt::format("{} is sm_{}; cuDNN's fused attention needs sm_80 or newer",
                                 p.q.device.str(), cc);
  }
  if (cudnnGetVersion() < 90000) {
    return fmt::format("cuDNN {} is loaded; this backend needs cuDNN 9", cudnnGetVersion());
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
    std::string why = view_reason(*view, name);
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
  const Band band = band_of(p);
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
  return {};
}

void check_output(const AttentionView& view, const AttentionView& like, const char* what) {
  validate_attention_output(view, like, what);
  TESSEL_CHECK(view.dtype == like.dtype, InvalidArgument,
               "cudnn: {} has dtype {}; expected {} like the inputs", what, dtype_name(view.dtype),
               dtype_name(like.dtype));
  const std::string why = view_reason(view, what);
  TESSEL_CHECK(why.empty(), InvalidArgument, "cudnn: {}", why);
}

// Runs a cached graph on the current stream of the problem's device.
void execute(const GraphKey& key, std::unordered_map<int64_t, void*>& pack, Device device) {
  tessel::cuda::DeviceGuard guard(device.index);
  const std::shared_ptr<CachedGraph> g = graph_for(key);
  TESSEL_CHECK(g->graph != nullptr, InvalidArgument, "cudnn: cuDNN cannot run {}: {}", key_str(key),
               g->error);
  cudnnHandle_t handle = thread_handle(device.index);
  check_cudnn(
      cudnnSetStream(handle, static_cast<cudaStream_t>(current_stream(device).native_handle())),
      "cudnnSetStream");
  Tensor workspace;
  if (g->workspace_bytes > 0) workspace = empty({g->workspace_bytes}, DType::kBool, device);
  std::lock_guard<std::mutex> lock(g->run);
  fe::error_t status =
      g->graph->execute(handle, pack, workspace.defined() ? workspace.data_ptr() : nullptr);
  TESSEL_CHECK(status.is_good(), Internal, "cudnn-frontend execute ({}) failed: {}", key_str(key),
               status.get_message());
}

void check_problem(const AttentionProblem& p) {
  validate_attention_problem(p);
  const std::string why = static_reason(p);
  TESSEL_CHECK(why.empty(), InvalidArgument, "cudnn: {}", why);
}

}  // namespace

bool cudnn_sdpa_is_available() { return true; }

std::string cudnn_sdpa_unsupported_reason(const AttentionProblem& p) {
  std::string why = static_reason(p);
  if (!why.empty()) return why;
  // Ask cuDNN itself, with the layouts scaled_dot_product_attention allocates (outputs and
  // gradients laid out like q, k, v; the output gradient like the output): both graphs are
  // built now and cached for the calls that follow.
  tessel::cuda::DeviceGuard guard(p.q.device.index);
  const std::vector<int64_t> out = dense_strides_like(p.q), dk = dense_strides_like(p.k);
  const std::vector<int64_t> dv = dense_strides_like(p.v);
  for (const GraphKey& key : {forward_key(p, out), backward_key(p, out, out, out, dk, dv)}) {
    const std::shared_ptr<CachedGraph> g = graph_for(key);
    if (g->graph == nullptr) return "cuDNN cannot run this " + key_str(key) + ": " + g->error;
  }
  return {};
}

void cudnn_sdpa_forward(const AttentionProblem& p, const AttentionView& out, float* lse) {
  check_problem(p);
  check_output(out, p.q, "out");
  Tensor lse_scratch;
  if (lse == nullptr) {
    lse_scratch = empty({p.batch() * p.q_heads() * p.q_len()}, DType::kF32, p.q.device);
    lse = lse_scratch.data<float>();
  }
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data}, {kK, p.k.data}, {kV, p.v.data}, {kO, out.data}, {kStats, lse}};
  execute(forward_key(p, strides_of(out)), pack, p.q.device);
}

void cudnn_sdpa_backward(const AttentionProblem& p, const AttentionView& out,
                         const AttentionView& dout, const float* lse, const AttentionView& dq,
                         const AttentionView& dk, const AttentionView& dv) {
  check_problem(p);
  check_output(out, p.q, "out");
  check_output(dout, p.q, "dout");
  check_output(dq, p.q, "dq");
  check_output(dk, p.k, "dk");
  check_output(dv, p.v, "dv");
  TESSEL_CHECK(lse != nullptr, InvalidArgument,
               "cudnn_sdpa_backward: lse is null; pass the forward's logsumexp");
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data}, {kK, p.k.data},     {kV, p.v.data},
      {kO, out.data}, {kDout, dout.data}, {kStats, const_cast<float*>(lse)},
      {kDq, dq.data}, {kDk, dk.data},     {kDv, dv.data}};
  execute(backward_key(p, strides_of(out), strides_of(dout), strides_of(dq), strides_of(dk),
                       strides_of(dv)),
          pack, p.q.device);
}

}  // namespace tessel::kernels::attention
