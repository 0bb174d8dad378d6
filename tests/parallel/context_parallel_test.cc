// Context parallelism of the GPT on rank threads against single-process training (tp_checks:
// every step's loss over 20 AdamW steps within 1e-5 relative, every first-step gradient within
// 1e-5 of its largest entry): cp = 2 and 3 (uneven slices of the 16-token sequences, the loss
// rescaled by cp_shard_batch), and (dp_shard, cp, tp) = (2, 2, 2) with FSDP over dp_shard and
// cp flattened.
#include <gtest/gtest.h>

#include <string>

#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/cp/gpt_cp.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/tp_checks.h"

namespace tessel {
namespace {

using testing::TpRun;
using testing::TpSetup;

const TpRun& single() {
  static const TpRun run = testing::train_single_process(20);
  return run;
}

void expect_parity(const TpSetup& setup) {
  const TpRun got = testing::train_tensor_parallel_threads(setup);
  const std::string error = testing::parity_error(got, single());
  EXPECT_TRUE(error.empty()) << error;
}

TEST(ContextParallelTest, GptAtCpTwoAndThreeMatchesSingleProcess) {
  for (int64_t cp : {2, 3}) {
    SCOPED_TRACE("cp " + std::to_string(cp));
    expect_parity({{cp, 1}, {"cp", "tp"}});
  }
}

TEST(ContextParallelTest, DpShardTimesCpTimesTpMatchesSingleProcess) {
  expect_parity({{2, 2, 2}, {"dp_shard", "cp", "tp"}});
}

TEST(ContextParallelTest, ShardBatchSlicesAndScalesTheLoss) {
  const parallel::CpLayout layout = parallel::cp_layout_load_balanced(16, 3);  // 3,3,3,3,2,2
  const Tensor x = reshape(arange(32), {2, 16}), docs = arange(16);
  const parallel::CpBatch b = parallel::cp_shard_batch(x, add(x, 1), layout, 0, docs);
  EXPECT_EQ(to_vector<int64_t>(b.positions), (std::vector<int64_t>{0, 1, 2, 14, 15}));
  EXPECT_EQ(to_vector<int64_t>(b.document_ids), to_vector<int64_t>(b.positions));
  EXPECT_EQ(to_vector<int64_t>(select(b.tokens, 0, 1)), (std::vector<int64_t>{16, 17, 18, 30, 31}));
  EXPECT_DOUBLE_EQ(b.loss_scale, 5.0 * 3 / 16);
  EXPECT_THROW(parallel::cp_shard_batch(x, arange(16), layout, 0), InvalidArgument);
}

}  // namespace
}  // namespace tessel
