// The cuDNN backend: cudnn-frontend graphs for scaled dot-product attention, built once per
// (device, shapes, strides, mask, scale, direction) when that direction first runs, and cached
// (cudnn_sdpa_support.h); every cuDNN and frontend call
// checked and turned into a tessel error that names it.
#include "tessel/kernels/attention/cudnn/cudnn_sdpa.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/kernels/attention/cuda/flash_cuda.h"
#include "tessel/kernels/attention/cudnn/cudnn_sdpa_support.h"
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

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null when the build failed
  int64_t workspace_bytes = 0;
  std::string error;  // why the build failed
  std::mutex run;     // one execute at a time per graph object
};

// Builds the graph of `key`; returns the frontend's error message instead of throwing.
std::shared_ptr<CachedGraph> build_graph(const CudnnGraphKey& key, cudnnHandle_t handle) {
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
  if (key.direction == SdpaDirection::kForward) {
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
                cudnn_graph_key_str(key), plan, cached->workspace_bytes);
    }
  }
  return cached;
}

// The process-wide graphs (one of the documented singletons; never destroyed, since calls may
// run during exit), built per direction on first use: an inference call builds no backward.
constexpr size_t kMaxCachedGraphs = 256;

CudnnSdpaGraphs<CachedGraph>& graphs() {
  static auto* g = new CudnnSdpaGraphs<CachedGraph>(kMaxCachedGraphs, [](const CudnnGraphKey& key) {
    return build_graph(key, thread_handle(key.device));
  });
  return *g;
}

CudnnEnvironment environment_of(const AttentionProblem& p) {
  if (!p.q.device.is_cuda()) return {};
  return {cuda_compute_capability(p.q.device.index), static_cast<int64_t>(cudnnGetVersion())};
}

void check_output(const AttentionView& view, const AttentionView& like, const char* what) {
  validate_attention_output(view, like, what);
  TESSEL_CHECK(view.dtype == like.dtype, InvalidArgument,
               "cudnn: {} has dtype {}; expected {} like the inputs", what, dtype_name(view.dtype),
               dtype_name(like.dtype));
  const std::string why = cudnn_view_reason(view, what);
  TESSEL_CHECK(why.empty(), InvalidArgument, "cudnn: {}", why);
}

// Runs the graph of `key` (cached, or built now) on the current stream of the problem's device.
void execute(const CudnnGraphKey& key, std::unordered_map<int64_t, void*>& pack, Device device) {
  tessel::cuda::DeviceGuard guard(device.index);
  const std::shared_ptr<CachedGraph> g = graphs().graph(key);
  TESSEL_CHECK(g->graph != nullptr, InvalidArgument, "cudnn: cuDNN cannot run {}: {}",
               cudnn_graph_key_str(key), g->error);
  cudnnHandle_t handle = thread_handle(device.index);
  check_cudnn(
      cudnnSetStream(handle, static_cast<cudaStream_t>(current_stream(device).native_handle())),
      "cudnnSetStream");
  Tensor workspace;
  if (g->workspace_bytes > 0) workspace = empty({g->workspace_bytes}, DType::kBool, device);
  std::lock_guard<std::mutex> lock(g->run);
  fe::error_t status =
      g->graph->execute(handle, pack, workspace.defined() ? workspace.data_ptr() : nullptr);
  TESSEL_CHECK(status.is_good(), Internal, "cudnn-frontend execute ({}) failed: {}",
               cudnn_graph_key_str(key), status.get_message());
}

void check_problem(const AttentionProblem& p, SdpaDirection direction) {
  validate_attention_problem(p);
  const std::string why = cudnn_sdpa_rule_reason(p, environment_of(p), direction);
  TESSEL_CHECK(why.empty(), InvalidArgument, "cudnn: {}", why);
}

}  // namespace

bool cudnn_sdpa_is_available() { return true; }

std::string cudnn_sdpa_unsupported_reason(const AttentionProblem& p) {
  const CudnnEnvironment env = environment_of(p);
  std::string why = cudnn_sdpa_rule_reason(p, env, SdpaDirection::kForward);
  if (!why.empty()) return why;
  // Ask cuDNN itself about the forward only, with the output laid out like q as
  // scaled_dot_product_attention allocates it; the graph is cached for the call that follows.
  // The backward graph waits for the first backward (cudnn_sdpa_backward_unsupported_reason).
  tessel::cuda::DeviceGuard guard(p.q.device.index);
  return graphs().forward_reason(p, env, dense_strides_like(p.q));
}

std::string cudnn_sdpa_backward_unsupported_reason(const AttentionProblem& p,
                                                   const AttentionView& out,
                                                   const AttentionView& dout,
                                                   const AttentionView& dq, const AttentionView& dk,
                                                   const AttentionView& dv) {
  const CudnnEnvironment env = environment_of(p);
  std::string why = cudnn_sdpa_rule_reason(p, env, SdpaDirection::kBackward);
  if (!why.empty()) return why;
  tessel::cuda::DeviceGuard guard(p.q.device.index);
  return graphs().backward_reason(
      p, env,
      {cudnn_strides_of(out), cudnn_strides_of(dout), cudnn_strides_of(dq), cudnn_strides_of(dk),
       cudnn_strides_of(dv)});
}

int64_t cudnn_sdpa_graph_builds(SdpaDirection direction) { return graphs().builds(direction); }

void cudnn_sdpa_forward(const AttentionProblem& p, const AttentionView& out, float* lse) {
  check_problem(p, SdpaDirection::kForward);
  check_output(out, p.q, "out");
  Tensor lse_scratch;
  if (lse == nullptr) {
    lse_scratch = empty({p.batch() * p.q_heads() * p.q_len()}, DType::kF32, p.q.device);
    lse = lse_scratch.data<float>();
  }
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data}, {kK, p.k.data}, {kV, p.v.data}, {kO, out.data}, {kStats, lse}};
  execute(cudnn_forward_graph_key(p, cudnn_strides_of(out)), pack, p.q.device);
}

void cudnn_sdpa_backward(const AttentionProblem& p, const AttentionView& out,
                         const AttentionView& dout, const float* lse, const AttentionView& dq,
                         const AttentionView& dk, const AttentionView& dv) {
  check_problem(p, SdpaDirection::kBackward);
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
  execute(cudnn_backward_graph_key(
              p, {cudnn_strides_of(out), cudnn_strides_of(dout), cudnn_strides_of(dq),
                  cudnn_strides_of(dk), cudnn_strides_of(dv)}),
          pack, p.q.device);
}

}  // namespace tessel::kernels::attention
