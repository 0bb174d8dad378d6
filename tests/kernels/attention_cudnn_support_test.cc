// The cuDNN backend's host side (no GPU, no cuDNN needed): which calls cuDNN takes and which go
// to flash_cuda with what reason — a table of configurations per direction, device and cuDNN
// version, including a graph whose support check fails — that its graphs are built per
// direction only when that direction runs (an inference call builds no backward graph) and
// keyed by direction, layout and determinism, and that fallbacks are recorded once per reason.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tessel/kernels/attention/cudnn/cudnn_sdpa_support.h"

namespace tessel::kernels::attention {
namespace {

// Views of (B, H, S, D) on cuda:0 over a never-dereferenced, 16-byte aligned address.
AttentionView cuda_view(DType dtype, int64_t b, int64_t h, int64_t s, int64_t d) {
  alignas(16) static char base[16];
  AttentionView v = attention_view(static_cast<void*>(base), dtype, {b, h, s, d});
  v.device = Device::cuda(0);
  return v;
}

struct Config {
  const char* name;
  DType dtype = DType::kBF16;
  int64_t b = 2, hq = 8, hkv = 2, sq = 256, sk = 256, d = 64;
  bool causal = true;
  MaskAlignment alignment = MaskAlignment::kTopLeft;
  int64_t window_left = -1, window_right = -1;
  bool deterministic = false;
  bool dropout = false;
  bool documents = false;
  bool on_cpu = false;
  CudnnEnvironment env{90, 91900};
  SdpaDirection direction = SdpaDirection::kForward;
  std::string graph_error;  // what the graph's support check answers ("" builds)
  // Expected: "" for cudnn, else a piece of the reason flash_cuda runs it for.
  std::string declined;
};

AttentionProblem problem_of(const Config& c) {
  AttentionProblem p;
  p.q = cuda_view(c.dtype, c.b, c.hq, c.sq, c.d);
  p.k = p.v = cuda_view(c.dtype, c.b, c.hkv, c.sk, c.d);
  if (c.on_cpu) p.q.device = p.k.device = p.v.device = Device::cpu();
  p.mask.causal = c.causal;
  p.mask.alignment = c.alignment;
  p.mask.window_left = c.window_left;
  p.mask.window_right = c.window_right;
  if (c.documents) p.mask.q_document_ids.assign(static_cast<size_t>(c.sq), 0);
  if (c.dropout) p.dropout = {0.1, 1, 0};
  p.deterministic = c.deterministic;
  validate_attention_problem(p);
  return p;
}

// A graph as the cache sees it: built ("") or declined by cuDNN's support check.
struct FakeGraph {
  std::string error;
};

std::vector<Config> table() {
  const CudnnEnvironment ampere{80, 91900}, blackwell_old{100, 91700};
  const CudnnEnvironment cudnn95{90, 90500};
  const SdpaDirection fwd = SdpaDirection::kForward, bwd = SdpaDirection::kBackward;
  std::vector<Config> t;
  auto add = [&](Config c) { t.push_back(std::move(c)); };
  add({.name = "causal forward"});
  add({.name = "causal backward", .direction = bwd});
  add({.name = "gqa ampere backward", .env = ampere, .direction = bwd});
  // Deterministic backward: cuDNN's needs an S_q x S_k workspace; none on old Blackwell stacks.
  add({.name = "deterministic small", .deterministic = true, .direction = bwd});
  add({.name = "deterministic forward",
       .b = 8,
       .hq = 32,
       .sq = 4096,
       .sk = 4096,
       .deterministic = true,
       .direction = fwd});
  add({.name = "deterministic large",
       .b = 8,
       .hq = 32,
       .sq = 4096,
       .sk = 4096,
       .deterministic = true,
       .direction = bwd,
       .declined = "a deterministic backward; cuDNN's needs a 8192 MiB S_q x S_k workspace"});
  add({.name = "deterministic blackwell old",
       .deterministic = true,
       .env = blackwell_old,
       .direction = bwd,
       .declined = "deterministic backward on sm_100; cuDNN 9.17.0 has none there"});
  // Head dims: cuDNN's range, and a small one its support check declines.
  add({.name = "head dim 256", .d = 256, .declined = "head dim 256; cudnn supports head dims 8"});
  add({.name = "head dim 12", .d = 12, .declined = "head dim 12"});
  add({.name = "head dim 32 declined by the graph",
       .d = 32,
       .direction = bwd,
       .graph_error = "cudnn-frontend check_support failed: no engine",
       .declined = "cuDNN declines this backward bf16 q (2, 8, 256, 32)"});
  // Window conventions.
  add({.name = "left window only",
       .causal = false,
       .window_left = 16,
       .declined = "a left window without a right bound"});
  add({.name = "sliding window causal", .window_left = 16});
  add({.name = "bottom-right sq > sk",
       .sq = 300,
       .sk = 200,
       .alignment = MaskAlignment::kBottomRight,
       .declined = "a bottom-right mask with S_q 300 > S_k 200"});
  add({.name = "window sq > sk",
       .sq = 300,
       .sk = 200,
       .window_left = 8,
       .declined = "a sliding window with S_q 300 > S_k 200"});
  add({.name = "bottom-right unaligned old cudnn",
       .sq = 100,
       .sk = 200,
       .alignment = MaskAlignment::kBottomRight,
       .env = cudnn95,
       .declined = "cuDNN 9.5.0 needs multiples of 64"});
  add({.name = "bottom-right unaligned",
       .sq = 100,
       .sk = 200,
       .alignment = MaskAlignment::kBottomRight});
  // What cuDNN never runs here.
  add({.name = "f32", .dtype = DType::kF32, .declined = "dtype f32; cudnn supports bf16 and f16"});
  add({.name = "dropout", .dropout = true, .declined = "dropout; cuDNN draws its own"});
  add({.name = "documents", .documents = true, .declined = "prefix lengths, documents"});
  add({.name = "sm_75", .env = {75, 91900}, .declined = "is sm_75; cuDNN's fused attention"});
  add({.name = "cudnn 8", .env = {90, 8907}, .declined = "this backend needs cuDNN 9"});
  add({.name = "cpu", .on_cpu = true, .declined = "tensors are on cpu"});
  return t;
}

TEST(CudnnSupportTest, TableOfConfigurationsGoesToCudnnOrFlashWithTheReason) {
  for (const Config& c : table()) {
    SCOPED_TRACE(c.name);
    int builds_asked = 0;
    CudnnSdpaGraphs<FakeGraph> graphs(8, [&](const CudnnGraphKey&) {
      ++builds_asked;
      return std::make_shared<FakeGraph>(FakeGraph{c.graph_error});
    });
    const AttentionProblem p = problem_of(c);
    const std::string why = c.direction == SdpaDirection::kForward
                                ? graphs.forward_reason(p, c.env, dense_strides_like(p.q))
                                : graphs.backward_reason(p, c.env, dense_backward_strides(p));
    const std::string rules = cudnn_sdpa_rule_reason(p, c.env, c.direction);
    if (c.declined.empty()) {
      EXPECT_EQ(why, "") << "expected cudnn";
      EXPECT_EQ(builds_asked, 1) << "the direction's graph is asked once";
    } else {
      EXPECT_NE(why.find(c.declined), std::string::npos) << "flash_cuda, because: " << why;
      // The graph is asked only when the rules pass.
      EXPECT_EQ(builds_asked, rules.empty() ? 1 : 0);
    }
    EXPECT_EQ(graphs.builds(c.direction == SdpaDirection::kForward ? SdpaDirection::kBackward
                                                                   : SdpaDirection::kForward),
              0)
        << "a call of one direction built the other's graph";
  }
}

TEST(CudnnSupportTest, DeterministicWorkspaceIsPaddedSqBySk) {
  Config c{.name = "w", .b = 1, .hq = 2, .sq = 65, .sk = 129};
  EXPECT_EQ(cudnn_deterministic_workspace_bytes(problem_of(c)), 1 * 2 * 128 * 256 * 2);
}

// Inference builds only forward graphs; the backward graph comes with the first backward and is
// reused; keys separate direction, layout and determinism; the cache stays bounded.
TEST(CudnnSupportTest, GraphsAreBuiltPerDirectionOnFirstUse) {
  std::vector<CudnnGraphKey> built;
  CudnnSdpaGraphs<FakeGraph> graphs(4, [&](const CudnnGraphKey& key) {
    built.push_back(key);
    return std::make_shared<FakeGraph>();
  });
  const CudnnEnvironment env{90, 91900};
  const AttentionProblem p = problem_of({.name = "p"});
  for (int step = 0; step < 3; ++step) {  // inference: forward only
    EXPECT_EQ(graphs.forward_reason(p, env, dense_strides_like(p.q)), "");
  }
  EXPECT_EQ(graphs.builds(SdpaDirection::kForward), 1);
  EXPECT_EQ(graphs.builds(SdpaDirection::kBackward), 0);

  for (int step = 0; step < 2; ++step) {  // training: the backward graph once
    EXPECT_EQ(graphs.backward_reason(p, env, dense_backward_strides(p)), "");
  }
  EXPECT_EQ(graphs.builds(SdpaDirection::kForward), 1);
  EXPECT_EQ(graphs.builds(SdpaDirection::kBackward), 1);
  ASSERT_EQ(built.size(), 2u);
  EXPECT_EQ(built[0].direction, SdpaDirection::kForward);
  EXPECT_EQ(built[1].direction, SdpaDirection::kBackward);
  EXPECT_EQ(built[1].strides.size(), 8u);
  EXPECT_NE(cudnn_forward_graph_key(p, dense_strides_like(p.q)),
            cudnn_backward_graph_key(p, dense_backward_strides(p)));

  // An output gradient in another layout, or a deterministic backward: other graphs.
  CudnnBackwardStrides other = dense_backward_strides(p);
  other.dout = {p.q_len() * p.q_heads() * p.head_dim(), p.head_dim(), p.q_heads() * p.head_dim(),
                1};  // (B, S, H, D) in memory
  EXPECT_EQ(graphs.backward_reason(p, env, other), "");
  AttentionProblem det = p;
  det.deterministic = true;
  EXPECT_EQ(graphs.backward_reason(det, env, dense_backward_strides(det)), "");
  EXPECT_TRUE(built.back().deterministic);
  EXPECT_EQ(graphs.builds(SdpaDirection::kBackward), 3);
  // Determinism is not part of a forward graph's key.
  EXPECT_EQ(graphs.forward_reason(det, env, dense_strides_like(det.q)), "");
  EXPECT_EQ(graphs.builds(SdpaDirection::kForward), 1);
  EXPECT_EQ(graphs.size(), 4u);
  // A new sequence length: a new forward graph, and the least recently used one forgotten.
  const AttentionProblem longer = problem_of({.name = "longer", .sq = 512, .sk = 512});
  EXPECT_EQ(graphs.forward_reason(longer, env, dense_strides_like(longer.q)), "");
  EXPECT_EQ(graphs.builds(SdpaDirection::kForward), 2);
  EXPECT_EQ(graphs.size(), 4u) << "bounded at 4";
}

TEST(CudnnSupportTest, FailedBuildsAreCachedAndNamedInTheReason) {
  int calls = 0;
  CudnnSdpaGraphs<FakeGraph> graphs(4, [&](const CudnnGraphKey&) {
    ++calls;
    return std::make_shared<FakeGraph>(FakeGraph{"cudnn-frontend build_plans failed: x"});
  });
  const AttentionProblem p = problem_of({.name = "p", .d = 32});
  const CudnnEnvironment env{90, 91900};
  const std::string first = graphs.forward_reason(p, env, dense_strides_like(p.q));
  EXPECT_NE(first.find("cuDNN declines this forward bf16 q (2, 8, 256, 32)"), std::string::npos)
      << first;
  EXPECT_NE(first.find("build_plans failed: x"), std::string::npos) << first;
  EXPECT_EQ(graphs.forward_reason(p, env, dense_strides_like(p.q)), first);
  EXPECT_EQ(calls, 1);
}

TEST(CudnnSupportTest, FallbacksAreRecordedOncePerReasonAndCounted) {
  const size_t before = cudnn_sdpa_fallbacks().size();
  for (int i = 0; i < 3; ++i) {
    record_cudnn_sdpa_fallback(SdpaDirection::kBackward, "bf16 q (1, 1, 8, 64) on cuda:0",
                               "test reason a");
  }
  record_cudnn_sdpa_fallback(SdpaDirection::kForward, "f", "test reason a");
  const std::vector<CudnnFallback> all = cudnn_sdpa_fallbacks();
  ASSERT_EQ(all.size(), before + 2);
  EXPECT_EQ(all[before].direction, SdpaDirection::kBackward);
  EXPECT_EQ(all[before].count, 3);
  EXPECT_EQ(all[before].first_call, "bf16 q (1, 1, 8, 64) on cuda:0");
  EXPECT_EQ(all[before + 1].direction, SdpaDirection::kForward);
  EXPECT_EQ(all[before + 1].count, 1);
}

}  // namespace
}  // namespace tessel::kernels::attention
