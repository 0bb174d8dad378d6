// Context parallelism over Gloo with real processes (forked, FileStore rendezvous): the GPT at
// cp = 3 (odd ring, uneven slices of the 16-token sequences), so ring attention's K/V and dK/dV
// messages cross TCP in forward and backward; every process compares its run with
// single-process training (the tolerances of the threads test). And ring attention itself at
// cp = 2, 3, 4 with a causal sliding window and per-batch document ids, ring and all-gather
// schedules: each process's output and dQ, dK, dV equal its slice of one process's attention
// (1e-4).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/kernels/attention/sdpa.h"
#include "tessel/parallel/cp/ring_attention.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/autograd.h"
#include "tessel/tensor/ops.h"
#include "tests/collectives/collective_checks.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parallel/tp_checks.h"

namespace tessel {
namespace {

TEST(ContextParallelGlooTest, GptAtCpThreeOverThreeProcessesMatchesSingleProcess) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const testing::TpSetup setup{.shape = {3, 1}, .names = {"cp", "tp"}, .steps = 8};
  const auto outcomes = testing::run_processes(
      3,
      [&setup](int rank, const std::string& store_dir) {
        auto store = std::make_shared<FileStore>(store_dir);
        GlooOptions options;
        options.hostname = "127.0.0.1";
        options.group.timeout = std::chrono::seconds(30);
        auto pg = gloo::create_process_group(store, rank, 3, options);
        const testing::TpRun got = testing::train_tensor_parallel(pg, setup);
        const std::string error =
            testing::parity_error(got, testing::train_single_process(setup.steps), 1e-5, 1e-5);
        if (!error.empty()) throw testing::CheckFailure(error);
      },
      std::chrono::seconds(100));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
}

// One process's max |a - b| over this rank's slice of `whole` (along dim 2).
float slice_error(const Tensor& local, const Tensor& whole, const parallel::CpLayout& layout,
                  int rank) {
  return item(max(abs(sub(local, parallel::cp_shard_sequence(whole, layout, rank, 2)))));
}

void check_masked_ring_attention(ProcessGroup& pg, parallel::CpAttentionAlgorithm algorithm) {
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 29, D = 16;
  Generator gen(11);  // the same tensors in every process
  const Tensor q = randn({B, Hq, S, D}, gen), k = randn({B, Hkv, S, D}, gen);
  const Tensor v = randn({B, Hkv, S, D}, gen), w = randn({B, Hq, S, D}, gen);
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) ids.push_back((s + 3 * b) / 7);  // documents of 7 tokens
  }
  const Tensor docs = from_vector<int64_t>(ids, {B, S});
  Tensor q1 = clone(q), k1 = clone(k), v1 = clone(v);
  for (Tensor* t : {&q1, &k1, &v1}) t->set_requires_grad(true);
  kernels::SdpaOptions so;
  so.causal = true;
  so.window_left = 5;
  so.document_ids = docs;
  const Tensor ref = kernels::scaled_dot_product_attention(q1, k1, v1, so);
  backward(sum(mul(ref, w)));

  const parallel::CpLayout layout = parallel::cp_layout_load_balanced(S, pg.size());
  const int r = pg.rank();
  Tensor ql = clone(parallel::cp_shard_sequence(q, layout, r, 2));
  Tensor kl = clone(parallel::cp_shard_sequence(k, layout, r, 2));
  Tensor vl = clone(parallel::cp_shard_sequence(v, layout, r, 2));
  for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
  parallel::RingAttentionOptions o{.causal = true, .window_left = 5, .algorithm = algorithm};
  o.document_ids = parallel::cp_shard_sequence(docs, layout, r, 1);
  const parallel::RingAttentionOutput out = parallel::ring_attention(pg, ql, kl, vl, layout, o);
  backward(sum(mul(out.output, parallel::cp_shard_sequence(w, layout, r, 2))));
  const float err = std::max(
      {slice_error(out.output, ref, layout, r), slice_error(ql.grad(), q1.grad(), layout, r),
       slice_error(kl.grad(), k1.grad(), layout, r), slice_error(vl.grad(), v1.grad(), layout, r)});
  if (!(err <= 1e-4f)) {
    throw testing::CheckFailure(fmt::format("rank {}: ring attention differs by {}", r, err));
  }
}

TEST(ContextParallelGlooTest, MaskedRingAttentionOverTwoToFourProcessesMatchesOneProcess) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  for (int cp : {2, 3, 4}) {
    SCOPED_TRACE("cp " + std::to_string(cp));
    const auto outcomes = testing::run_processes(
        cp,
        [cp](int rank, const std::string& store_dir) {
          auto store = std::make_shared<FileStore>(store_dir);
          GlooOptions options;
          options.hostname = "127.0.0.1";
          options.group.timeout = std::chrono::seconds(30);
          auto pg = gloo::create_process_group(store, rank, cp, options);
          check_masked_ring_attention(*pg, parallel::CpAttentionAlgorithm::kRing);
          check_masked_ring_attention(*pg, parallel::CpAttentionAlgorithm::kAllGather);
        },
        std::chrono::seconds(100));
    for (const auto& o : outcomes) {
      EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
    }
  }
}

}  // namespace
}  // namespace tessel
