// Checkpoints of a pipelined model on rank threads: a tiny GPT trained 5 steps at pp = 2 (1F1B)
// saves its stages' parameters and AdamW state through the distributed checkpoint (each rank its
// own stages' names, the checkpoint their union) and resumes at pp = 1, 4, 2 with 2 virtual
// stages per rank, and (pp, dp_shard) = (2, 2) with FSDP inside the stages (and back from it):
// the next 5 steps' losses match the uninterrupted pp = 2 run within 1e-5 relative, as the other
// reshard tests, and bit for bit on the same layout. States whose ranks disagree on a tensor,
// leave part of one unheld, or ask for a name the checkpoint lacks fail on every rank, naming it.

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/metadata.h"
#include "tessel/parallel/dtensor/dtensor.h"
#include "tessel/parallel/fsdp/fsdp.h"
#include "tessel/parallel/pp/gpt_stage.h"
#include "tessel/parallel/pp/runtime.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/stage_layout.h"
#include "tessel/tensor/ops.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel::pp {
namespace {

using testing::TempDir;

constexpr int kSaveAt = 5;
constexpr int kSteps = 10;
constexpr int64_t kRows = 8;
constexpr int64_t kSeq = 8;
constexpr int kMicrobatches = 4;
// As the other reshard tests: another layout adds the same numbers in another order.
constexpr double kTolerance = 1e-5;

nn::GptConfig config() {
  return {.vocab_size = 64, .block_size = kSeq, .n_layer = 4, .n_head = 2, .n_embd = 16, .seed = 3};
}

// Step i's tokens and targets: a pattern the model learns, so the loss and the moments move.
std::pair<Tensor, Tensor> tokens_of_step(int step) {
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < kRows; ++b) {
    for (int64_t t = 0; t <= kSeq; ++t) {
      const int64_t v = (step * 7 + b * 5 + t * (b % 4 + 1)) % 64;
      if (t < kSeq) x.push_back(v);
      if (t > 0) y.push_back(v);
    }
  }
  return {from_vector<int64_t>(x, {kRows, kSeq}), from_vector<int64_t>(y, {kRows, kSeq})};
}

// A pipeline layout: pp ranks, `virtual_stages` stages per rank, FSDP over dp ranks.
struct Layout {
  int pp = 2;
  int virtual_stages = 1;
  int dp = 1;
  std::string schedule() const { return virtual_stages > 1 ? "interleaved-1f1b" : "1f1b"; }
};

struct TrainRun {
  std::vector<double> losses;            // per step run: the mean over ranks of the returned losses
  std::vector<int64_t> optimizer_steps;  // per rank: the AdamW step count after loading
};

// Trains steps [first, kSteps) of `layout` on rank threads (resuming from `resume` when set) and
// saves the state after step kSaveAt into `save` (when set).
// `with_optimizer` false: the AdamW state is left out of the checkpoint state.
TrainRun train(const Layout& layout, int first, const std::string& resume, const std::string& save,
               bool with_optimizer = true) {
  const int world = layout.pp * layout.dp;
  std::vector<std::vector<double>> losses(static_cast<size_t>(world));
  TrainRun run;
  run.optimizer_steps.resize(static_cast<size_t>(world));
  std::mutex mu;
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    DeviceMesh mesh =
        init_device_mesh(pg.shared_from_this(), {layout.pp, layout.dp}, {"pp", "dp_shard"});
    const int stage_rank = static_cast<int>(mesh.local_rank("pp"));
    const int dp_rank = static_cast<int>(mesh.local_rank("dp_shard"));
    const int stages_count = layout.pp * layout.virtual_stages;
    auto stages = make_gpt_stages(config(), uniform_layout(4, stages_count), stage_rank, layout.pp);
    std::vector<LocalStage> local;
    for (auto& s : stages) {
      if (layout.dp > 1) fully_shard(*s, mesh["dp_shard"]);
      local.push_back({s->stage(), s});
    }
    nn::optim::AdamW* opt = nullptr;
    PipelineRuntime runtime(
        mesh.group("pp"),
        make_schedule(layout.schedule(), layout.pp, kMicrobatches, layout.virtual_stages), local,
        nn::GPT::loss,
        {.on_step =
             [&] {
               clip_grad_norm(runtime, 1.0);
               opt->step();
             },
         .tied_parameters = gpt_tied_parameters()});
    nn::optim::AdamW adamw(runtime.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
    opt = &adamw;
    // Each rank adds the stages it holds, under the whole model's names.
    checkpoint::CheckpointState state(pg.shared_from_this());
    state.ranks_hold_different_tensors = true;
    for (auto& s : stages) {
      state.add_model("model", *s);
      if (with_optimizer) state.add_optimizer("optim", adamw, *s);
    }
    if (!resume.empty()) checkpoint::load(state, resume);
    run.optimizer_steps[static_cast<size_t>(pg.rank())] = adamw.step_count();
    std::vector<double> mine;
    const int64_t rows = kRows / layout.dp;
    for (int step = first; step < kSteps; ++step) {
      auto [x, y] = tokens_of_step(step);
      mine.push_back(runtime.step(contiguous(narrow(x, 0, dp_rank * rows, rows)),
                                  contiguous(narrow(y, 0, dp_rank * rows, rows))));
      if (step + 1 == kSaveAt && !save.empty()) {
        state.step = kSaveAt;
        checkpoint::save(state, save);
      }
    }
    std::lock_guard lock(mu);
    losses[static_cast<size_t>(pg.rank())] = std::move(mine);
  });
  for (size_t i = 0; i < losses[0].size(); ++i) {
    double sum = 0;
    for (const auto& l : losses) sum += l[i];
    run.losses.push_back(sum / world);
  }
  return run;
}

std::vector<double> tail(const std::vector<double>& losses) {
  return {losses.end() - (kSteps - kSaveAt), losses.end()};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rtol * std::abs(want[i])) << what << ", step " << kSaveAt + i;
  }
}

class PipelineCheckpointTest : public ::testing::Test {
 protected:
  // The uninterrupted pp = 2 (1F1B) run, which saved at step 5 into dir_ / "pp2".
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    whole_ = new std::vector<double>(train({.pp = 2}, 0, "", *dir_ / "pp2").losses);
  }
  static void TearDownTestSuite() {
    delete whole_;
    delete dir_;
  }
  static TempDir* dir_;
  static std::vector<double>* whole_;
};
TempDir* PipelineCheckpointTest::dir_ = nullptr;
std::vector<double>* PipelineCheckpointTest::whole_ = nullptr;

TEST_F(PipelineCheckpointTest, TheCheckpointHoldsEveryStageAndTheOptimizerState) {
  ASSERT_EQ(whole_->size(), static_cast<size_t>(kSteps));
  EXPECT_LT(whole_->back(), whole_->front() - 0.05) << "the run learns";
  const checkpoint::CheckpointMetadata meta = checkpoint::read_checkpoint_metadata(*dir_ / "pp2");
  EXPECT_EQ(meta.step, kSaveAt);
  EXPECT_EQ(meta.metadata.at("tessel.optimizer.optim.step_count"), std::to_string(kSaveAt));
  // The whole model: both stages' blocks, the embeddings (stage 0), ln_f (stage 1), once each.
  nn::GPT model(config());
  for (const auto& [name, t] : model.named_parameters()) {
    EXPECT_TRUE(meta.tensors.contains("model." + name)) << name;
    EXPECT_TRUE(meta.tensors.contains("optim." + name + ".exp_avg")) << name;
    EXPECT_TRUE(meta.tensors.contains("optim." + name + ".exp_avg_sq")) << name;
  }
  // Rank 0 wrote stage 0's blocks, rank 1 stage 1's: each rank wrote a file.
  EXPECT_EQ(meta.files.size(), 2u);
  EXPECT_EQ(meta.tensors.at("model.transformer.h.0.attn.c_attn.weight").shards[0].file,
            "rank_00000.safetensors");
  EXPECT_EQ(meta.tensors.at("model.transformer.h.3.attn.c_attn.weight").shards[0].file,
            "rank_00001.safetensors");
}

TEST_F(PipelineCheckpointTest, ResumesOnTheSameLayoutBitForBit) {
  const TrainRun run = train({.pp = 2}, kSaveAt, *dir_ / "pp2", "");
  EXPECT_EQ(run.losses, tail(*whole_));
  EXPECT_EQ(run.optimizer_steps, std::vector<int64_t>(2, kSaveAt)) << "the step count is loaded";
  // Without the AdamW moments and step count the run goes elsewhere: they matter, and are loaded.
  const TrainRun fresh = train({.pp = 2}, kSaveAt, *dir_ / "pp2", "", /*with_optimizer=*/false);
  EXPECT_EQ(fresh.optimizer_steps, std::vector<int64_t>(2, 0));
  EXPECT_GT(std::abs(fresh.losses.back() - whole_->back()), 100 * kTolerance * whole_->back());
}

TEST_F(PipelineCheckpointTest, ResumesOnOtherPipelineDegreesAndVirtualStages) {
  const std::string from = *dir_ / "pp2";
  expect_close(train({.pp = 1}, kSaveAt, from, "").losses, tail(*whole_), kTolerance, "pp = 1");
  expect_close(train({.pp = 4}, kSaveAt, from, "").losses, tail(*whole_), kTolerance, "pp = 4");
  expect_close(train({.pp = 2, .virtual_stages = 2}, kSaveAt, from, "").losses, tail(*whole_),
               kTolerance, "pp = 2, 2 virtual stages");
}

// FSDP inside the stages: each rank holds shards of its stages (DTensors on its stage's dp_shard
// sub-mesh); a save from there loads on a plain pipeline, and the pp = 2 checkpoint loads there.
TEST_F(PipelineCheckpointTest, ResumesWithFsdpInsideStagesAndBack) {
  expect_close(train({.pp = 2, .dp = 2}, kSaveAt, *dir_ / "pp2", "").losses, tail(*whole_),
               kTolerance, "(pp, dp_shard) = (2, 2) from pp = 2");
  const TrainRun fsdp = train({.pp = 2, .dp = 2}, 0, "", *dir_ / "fsdp");
  expect_close(fsdp.losses, *whole_, kTolerance, "(pp, dp_shard) = (2, 2) from the start");
  expect_close(train({.pp = 4}, kSaveAt, *dir_ / "fsdp", "").losses, tail(fsdp.losses), kTolerance,
               "pp = 4 from (pp, dp_shard) = (2, 2)");
}

// Each rank's error, or "" when its call returned.
template <typename Fn>
std::vector<std::string> errors_of(int world, Fn fn) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  threads::run_ranks(world, [&](ProcessGroup& pg) {
    try {
      fn(pg);
    } catch (const InvalidArgument& e) {
      errors[static_cast<size_t>(pg.rank())] = e.what();
    }
  });
  return errors;
}

TEST_F(PipelineCheckpointTest, ANameTheCheckpointLacksFailsEveryRank) {
  const std::string dir = *dir_ / "pp2";
  const auto errors = errors_of(2, [&](ProcessGroup& pg) {
    checkpoint::CheckpointState state(pg.shared_from_this());
    state.ranks_hold_different_tensors = true;
    Tensor mine = zeros({4});
    if (pg.rank() == 1) state.add_tensor("model.lm_head.weight", mine);
    checkpoint::load(state, dir);
  });
  EXPECT_NE(errors[1].find("has no tensor 'model.lm_head.weight'"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("failed on rank 1"), std::string::npos) << errors[0];
}

TEST_F(PipelineCheckpointTest, HoldersThatDisagreeOrLeaveElementsUnheldFailEveryRank) {
  TempDir dir;
  // Two ranks hold "w" in different shapes.
  auto errors = errors_of(2, [&](ProcessGroup& pg) {
    checkpoint::CheckpointState state(pg.shared_from_this());
    state.ranks_hold_different_tensors = true;
    Tensor w = zeros(pg.rank() == 0 ? Shape{2, 3} : Shape{3, 2});
    state.add_tensor("w", w);
    checkpoint::save(state, dir / "a");
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("rank 0 holds tensor 'w' as f32[2, 3]"), std::string::npos) << e;
  }
  // Half of "w" (Shard(0) over both ranks) is held by nobody: only rank 0 adds it.
  errors = errors_of(2, [&](ProcessGroup& pg) {
    DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
    checkpoint::CheckpointState state(pg.shared_from_this());
    state.ranks_hold_different_tensors = true;
    Tensor v = zeros({3});
    state.add_tensor("v", v);
    if (pg.rank() == 0) state.add_tensor("w", distribute_tensor(zeros({4, 2}), mesh, {Shard(0)}));
    checkpoint::save(state, dir / "b");
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("4 of the 8 elements of tensor 'w'"), std::string::npos) << e;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
  EXPECT_FALSE(std::filesystem::exists(dir / "b"));
}

}  // namespace
}  // namespace tessel::pp
