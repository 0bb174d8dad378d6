// Sharded checkpoints in one process (ranks as threads): the plan's arithmetic, round trips of
// every kind of state, atomic commit when a rank fails, retention, async save, and bad input
// (missing, truncated or foreign files, changed shapes) failing before anything is written.
#include "tessel/parallel/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/threads/threads_backend.h"
#include "tessel/nn/linear.h"
#include "tessel/nn/optim/adamw.h"
#include "tessel/parallel/checkpoint/internal/files.h"
#include "tessel/parallel/checkpoint/internal/plan.h"
#include "tessel/parallel/checkpoint/metadata.h"
#include "tessel/tensor/ops.h"
#include "tessel/tensor/safetensors.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointState;
using checkpoint::internal::Box;

using testing::TempDir;

Tensor iota(const Shape& shape, DType dtype = DType::kF32, double start = 0) {
  return to(
      add(reshape(arange(0, static_cast<double>(shape_numel(shape)), 1.0, DType::kF32), shape),
          start),
      dtype);
}

std::vector<float> values(const Tensor& t) { return to_vector<float>(to(t, DType::kF32)); }

// Expects `f` to throw InvalidArgument whose message holds every one of `parts`.
template <typename F>
void expect_invalid(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
    }
  }
}

// --- The plan's arithmetic ---------------------------------------------------------------------

TEST(CheckpointPlanTest, RunsOfABoxAreMaximalAndInFileOrder) {
  const Box shard{{0, 0, 0}, {4, 6, 5}};
  // Whole trailing dims merge: rows 1..2 of dim 0 are one run of 2 * 30 elements.
  auto runs = checkpoint::internal::runs_of(shard, 100, 4, {{1, 0, 0}, {2, 6, 5}});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].file_offset, 100u + 30 * 4);
  EXPECT_EQ(runs[0].bytes, 60u * 4);
  // A column block: one run per (i, j) of 2 elements.
  runs = checkpoint::internal::runs_of(shard, 0, 2, {{1, 2, 3}, {2, 3, 2}});
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[0].file_offset, (1u * 30 + 2 * 5 + 3) * 2);
  EXPECT_EQ(runs[1].file_offset, (1u * 30 + 3 * 5 + 3) * 2);
  EXPECT_EQ(runs[3].file_offset, (2u * 30 + 2 * 5 + 3) * 2);
  EXPECT_EQ(runs[5].buffer_offset, 5u * 4);
  // A scalar, and an empty box.
  EXPECT_EQ(checkpoint::internal::runs_of({{}, {}}, 8, 4, {{}, {}}).size(), 1u);
  EXPECT_TRUE(checkpoint::internal::runs_of(shard, 0, 4, {{0, 0, 0}, {0, 6, 5}}).empty());
}

TEST(CheckpointPlanTest, IntersectionOfBoxes) {
  EXPECT_EQ(checkpoint::internal::intersect({{0, 0}, {4, 4}}, {{2, 3}, {4, 4}}),
            (Box{{2, 3}, {2, 1}}));
  EXPECT_FALSE(checkpoint::internal::intersect({{0, 0}, {4, 4}}, {{4, 0}, {1, 4}}).has_value());
}

// Replicated data is written once, by the holder with the fewest bytes so far.
TEST(CheckpointPlanTest, ReplicatedBoxesAreWrittenOnceAndSpread) {
  threads::run_ranks(4, [](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
    CheckpointState state(pg.shared_from_this());
    for (int i = 0; i < 4; ++i) {  // (Shard(0), Replicate()): 2 distinct boxes, each held twice
      state.add_tensor(fmt::format("t{}", i),
                       distribute_tensor(iota({6, 2}), mesh, {Shard{0}, Replicate{}}));
    }
    state.add_tensor("plain", iota({3}));  // on every rank
    const auto plan = checkpoint::internal::plan_save(state.tensors(), pg.rank(), 4, true);
    std::vector<int> writes(4, 0);
    for (const auto& t : plan.tensors) {
      for (int w : t.writers) ++writes[w];
    }
    EXPECT_EQ(plan.tensors[0].boxes.size(), 2u);
    EXPECT_EQ(plan.tensors[4].writers.size(), 1u);
    EXPECT_EQ(writes[0] + writes[1] + writes[2] + writes[3], 9);
    for (int w : writes) EXPECT_GE(w, 2);  // spread over every rank
    EXPECT_EQ(plan.files.size(), 4u);
  });
}

// --- Round trips -------------------------------------------------------------------------------

TEST(CheckpointTest, OneProcessRoundTripOfTensorsGeneratorsStepAndMetadata) {
  TempDir dir;
  const Tensor w = iota({5, 3}), b = iota({7}, DType::kBF16, 1), i = iota({2, 2}, DType::kI64, 3);
  const Tensor scalar = full({}, 2.5), empty_t = empty({0, 4});
  Generator gen(42);
  gen.reserve(1000);
  CheckpointState state;
  state.add_tensors("m",
                    nn::StateDict{{"w", w}, {"b", b}, {"i", i}, {"s", scalar}, {"e", empty_t}});
  state.add_generator("g", gen);
  state.step = 17;
  state.metadata["data.position"] = "12345";
  checkpoint::save(state, dir / "c");
  EXPECT_TRUE(fs::exists(dir / "c/metadata.json"));

  const Tensor w2 = zeros({5, 3}), b2 = zeros({7}, DType::kBF16), i2 = zeros({2, 2}, DType::kI64);
  const Tensor s2 = zeros({}), e2 = empty({0, 4});
  Generator gen2(1);
  CheckpointState loaded;
  loaded.add_tensors("m", nn::StateDict{{"w", w2}, {"b", b2}, {"i", i2}, {"s", s2}, {"e", e2}});
  loaded.add_generator("g", gen2);
  checkpoint::load(loaded, dir / "c");
  EXPECT_EQ(values(w2), values(w));
  EXPECT_EQ(values(b2), values(b));
  EXPECT_EQ(values(i2), values(i));
  EXPECT_EQ(values(s2), values(scalar));
  EXPECT_EQ(gen2.seed(), 42u);
  EXPECT_EQ(gen2.offset(), 1000u);
  EXPECT_EQ(loaded.step, 17);
  EXPECT_EQ(loaded.metadata.at("data.position"), "12345");
  // The shard file is plain safetensors.
  const SafetensorsFile f = load_safetensors(dir / "c/rank_00000.safetensors");
  EXPECT_EQ(values(f.tensors.at("m.w")), values(w));
}

TEST(CheckpointTest, OptimizerStateAndStepCountFollowTheParameters) {
  TempDir dir;
  nn::Linear a({.in_features = 4, .out_features = 3}), b({.in_features = 4, .out_features = 3});
  nn::optim::AdamW opt_a(a.parameters(), {}), opt_b(b.parameters(), {});
  for (int s = 0; s < 3; ++s) {
    for (const Tensor& p : a.parameters()) p.set_grad(full_like(p, 0.1 * (s + 1)));
    opt_a.step();
  }
  CheckpointState state;
  state.add_tensors("model", a.state_dict());
  state.add_optimizer("optim", opt_a, a);
  checkpoint::save(state, dir / "c");
  const auto meta = checkpoint::read_checkpoint_metadata(dir / "c");
  EXPECT_TRUE(meta.tensors.contains("optim.weight.exp_avg_sq"));

  CheckpointState target;
  target.add_tensors("model", b.state_dict());
  target.add_optimizer("optim", opt_b, b);
  checkpoint::load(target, dir / "c");
  EXPECT_EQ(opt_b.step_count(), 3);
  EXPECT_EQ(values(opt_b.exp_avg(0)), values(opt_a.exp_avg(0)));
  EXPECT_EQ(values(opt_b.exp_avg_sq(1)), values(opt_a.exp_avg_sq(1)));
  EXPECT_EQ(values(b.parameters()[0]), values(a.parameters()[0]));
}

// 2-D mesh, nested shards in both orders, uneven and empty shards: saved on 6 ranks, loaded on 4
// ranks with other placements and on one process.
TEST(CheckpointTest, TwoDimensionalShardsReshardOntoOtherMeshesAndOneProcess) {
  TempDir dir;
  const Tensor a = iota({7, 5}), b = iota({3, 10}, DType::kBF16, 100), c = iota({2}, DType::kI32);
  threads::run_ranks(6, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 3}, {"dp", "tp"});
    CheckpointState state(pg.shared_from_this());
    state.add_tensor("a",
                     distribute_tensor(a, mesh, {Shard{0}, Shard{0}}, {.shard_order = {1, 0}}));
    state.add_tensor("b", distribute_tensor(b, mesh, {Replicate{}, Shard{1}}));
    state.add_tensor("c", distribute_tensor(c, mesh, {Shard{0}, Shard{0}}));  // empty shards
    checkpoint::save(state, dir / "c");
  });
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {4}, {"dp"});
    CheckpointState state(pg.shared_from_this());
    DTensor da = distribute_tensor(zeros({7, 5}), mesh, {Shard{1}});
    DTensor db = distribute_tensor(zeros({3, 10}, DType::kBF16), mesh, {Shard{0}});
    DTensor dc = distribute_tensor(zeros({2}, DType::kI32), mesh, {Replicate{}});
    state.add_tensor("a", da);
    state.add_tensor("b", db);
    state.add_tensor("c", dc);
    checkpoint::load(state, dir / "c");
    EXPECT_EQ(values(da.full_tensor()), values(a));
    EXPECT_EQ(values(db.full_tensor()), values(b));
    EXPECT_EQ(values(dc.to_local()), values(c));
  });
  const Tensor a1 = zeros({7, 5}), b1 = zeros({3, 10}, DType::kBF16), c1 = zeros({2}, DType::kI32);
  CheckpointState one;
  one.add_tensors("", nn::StateDict{{"a", a1}, {"b", b1}, {"c", c1}});
  checkpoint::load(one, dir / "c");
  EXPECT_EQ(values(a1), values(a));
  EXPECT_EQ(values(b1), values(b));
  EXPECT_EQ(values(c1), values(c));
}

// DTensors on sub-meshes (each dp row its own "tp" mesh, each tp column its own "dp" mesh): no
// rank's spec says what the ranks outside its sub-mesh hold, so the ranks exchange their boxes;
// every box is written once and the checkpoint loads whole.
TEST(CheckpointTest, DTensorsOnSubMeshesAreSavedOnceAndLoadWhole) {
  TempDir dir;
  const Tensor a = iota({6, 4}), b = iota({5});
  threads::run_ranks(4, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2, 2}, {"dp", "tp"});
    CheckpointState state(pg.shared_from_this());
    state.add_tensor("a", distribute_tensor(a, mesh["tp"], {Shard{1}}));
    state.add_tensor("b", distribute_tensor(b, mesh["dp"], {Shard{0}}));
    checkpoint::save(state, dir / "c");
  });
  const auto meta = checkpoint::read_checkpoint_metadata(dir / "c");
  EXPECT_EQ(meta.tensors.at("a").shards.size(), 2u);  // each column half once, not per dp row
  EXPECT_EQ(meta.tensors.at("b").shards.size(), 2u);
  const Tensor a1 = zeros({6, 4}), b1 = zeros({5});
  CheckpointState one;
  one.add_tensors("", nn::StateDict{{"a", a1}, {"b", b1}});
  checkpoint::load(one, dir / "c");
  EXPECT_EQ(values(a1), values(a));
  EXPECT_EQ(values(b1), values(b));
}

// A tensor saved in its logical shape: (3, 4, 2) sections of a (12, 2) weight, split over the
// section rows, are saved as (12, 2) row blocks and load into the (12, 2) tensor and back.
TEST(CheckpointTest, FoldedTensorsAreSavedInTheirLogicalShape) {
  using checkpoint::internal::logical_boxes;
  EXPECT_EQ(logical_boxes({{0, 2, 0}, {3, 2, 2}}, {3, 4, 2}, {12, 2}, "w"),
            (std::vector<Box>{{{2, 0}, {2, 2}}, {{6, 0}, {2, 2}}, {{10, 0}, {2, 2}}}));
  EXPECT_EQ(logical_boxes({{1, 0}, {2, 3}}, {3, 4}, {}, "w"), (std::vector<Box>{{{1, 0}, {2, 3}}}));
  expect_invalid(
      [] {
        logical_boxes({{0, 0}, {3, 4}}, {3, 4}, {4, 3}, "w");
      },
      {"tensor 'w'", "not its leading dimensions folded"});
  TempDir dir;
  const Tensor w = iota({12, 2});
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"tp"});
    const DTensor sections = distribute_tensor(reshape(w, {3, 4, 2}), mesh, {Shard{1}});
    CheckpointState state(pg.shared_from_this());
    state.add({"w", sections.to_local(), std::make_shared<DTensorSpec>(sections.spec()), {12, 2}});
    checkpoint::save(state, dir / "c");
  });
  EXPECT_EQ(checkpoint::read_checkpoint_metadata(dir / "c").tensors.at("w").shape, (Shape{12, 2}));
  const Tensor w1 = zeros({12, 2});
  CheckpointState one;
  one.add_tensor("w", w1);
  checkpoint::load(one, dir / "c");
  EXPECT_EQ(values(w1), values(w));
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"tp"});
    const DTensor sections = distribute_tensor(zeros({3, 4, 2}), mesh, {Shard{1}});
    CheckpointState state(pg.shared_from_this());
    state.add({"w", sections.to_local(), std::make_shared<DTensorSpec>(sections.spec()), {12, 2}});
    checkpoint::load(state, dir / "c");
    EXPECT_EQ(values(sections.full_tensor()), values(w));
  });
}

// Generators that differ per rank come back per rank on the same world size and cannot be
// restored on another.
TEST(CheckpointTest, PerRankGeneratorsNeedTheSameWorldSize) {
  TempDir dir;
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    Generator gen(7);
    gen.reserve(10 * (pg.rank() + 1));
    CheckpointState state(pg.shared_from_this());
    state.add_generator("dropout", gen);
    checkpoint::save(state, dir / "c");
    Generator back(0);
    CheckpointState target(pg.shared_from_this());
    target.add_generator("dropout", back);
    checkpoint::load(target, dir / "c");
    EXPECT_EQ(back.offset(), 10u * (pg.rank() + 1));
  });
  Generator one(0);
  CheckpointState target;
  target.add_generator("dropout", one);
  expect_invalid([&] { checkpoint::load(target, dir / "c"); },
                 {"generator 'dropout' differs across the 2 ranks", "metadata.json"});
}

// --- Atomic commit -----------------------------------------------------------------------------

thread_local int this_rank = -1;  // the rank a rank thread runs (for fault hooks)

// A rank failing to write fails the save on every rank; nothing appears, the previous
// checkpoint stays the latest and loads.
TEST(CheckpointCommitTest, AFailedRankLeavesNoCheckpointAndThePreviousIntact) {
  TempDir dir;
  std::mutex mu;
  std::vector<std::string> errors;
  threads::run_ranks(3, [&](ProcessGroup& pg) {
    this_rank = pg.rank();
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {3}, {"dp"});
    DTensor t = distribute_tensor(iota({9, 2}), mesh, {Shard{0}});
    CheckpointState state(pg.shared_from_this());
    state.add_tensor("t", t);
    state.step = 1;
    checkpoint::save(state, dir / checkpoint::step_dir_name(1));
    pg.barrier();
    if (pg.rank() == 0) {
      checkpoint::internal::set_fault_hook([](std::string_view point) {
        if (point == "write.end" && this_rank == 2) {
          throw IoError("disk full (injected)");
        }
      });
    }
    pg.barrier();
    state.step = 2;
    try {
      checkpoint::save(state, dir / checkpoint::step_dir_name(2));
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e.what());
    }
  });
  checkpoint::internal::set_fault_hook(nullptr);
  ASSERT_EQ(errors.size(), 3u);
  bool named = false;
  for (const std::string& e : errors) named |= e.find("rank 2") != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.str()), dir / "step_00000001");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.str())) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"step_00000001"});  // the temporary folder is gone
  const Tensor back = zeros({9, 2});
  CheckpointState one;
  one.add_tensor("t", back);
  checkpoint::load(one, dir.str());
  EXPECT_EQ(values(back), values(iota({9, 2})));
}

TEST(CheckpointCommitTest, RanksThatSaveDifferentStatesAreRefused) {
  TempDir dir;
  std::atomic<int> refused{0};
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    CheckpointState state(pg.shared_from_this());
    state.add_tensor(pg.rank() == 0 ? "a" : "b", iota({2}));
    try {
      checkpoint::save(state, dir / "c");
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 saves another state"), std::string::npos);
      ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 2);
  EXPECT_FALSE(fs::exists(dir / "c"));
}

TEST(CheckpointerTest, AsyncSaveSnapshotsRetainsTheLastNAndLoadsTheLatest) {
  TempDir dir;
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
    DTensor t = distribute_tensor(iota({5, 3}), mesh, {Shard{0}});
    CheckpointState state(pg.shared_from_this());
    state.add_tensor("t", t);
    checkpoint::Checkpointer ckpt(pg.shared_from_this(), dir.str(), {.keep_last = 2});
    for (int step = 1; step <= 4; ++step) {
      state.step = step;
      fill_(t.to_local(), step);
      Work w = ckpt.async_save(state);
      fill_(t.to_local(), -1);  // after the snapshot: not in the checkpoint
      if (step == 4) w.wait(std::chrono::seconds(60));
    }
    ckpt.wait();
    pg.barrier();
    const auto list = checkpoint::list_checkpoints(dir.str());
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0].first, 3);
    EXPECT_EQ(list[1].first, 4);
    CheckpointState target(pg.shared_from_this());
    target.add_tensor("t", t);
    EXPECT_EQ(ckpt.load_latest(target), dir / "step_00000004");
    EXPECT_EQ(target.step, 4);
    EXPECT_EQ(values(t.to_local()), std::vector<float>(t.to_local().numel(), 4.0f));
  });
}

TEST(CheckpointerTest, LoadLatestOfAnEmptyRootLoadsNothing) {
  TempDir dir;
  const Tensor t = iota({3});
  CheckpointState state;
  state.add_tensor("t", t);
  checkpoint::Checkpointer ckpt(nullptr, dir.str());
  EXPECT_EQ(ckpt.load_latest(state), std::nullopt);
  EXPECT_EQ(values(t), values(iota({3})));
}

// --- Bad input ---------------------------------------------------------------------------------

class CheckpointBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    threads::run_ranks(2, [&](ProcessGroup& pg) {
      const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
      CheckpointState state(pg.shared_from_this());
      state.add_tensor("model.w", distribute_tensor(iota({6, 4}), mesh, {Shard{0}}));
      state.add_tensor("model.b", distribute_tensor(iota({4}), mesh, {Replicate{}}));
      checkpoint::save(state, path_);
    });
  }
  // Loads into fresh tensors, which must stay untouched when it throws.
  void load_expecting(const std::vector<std::string>& parts, const Shape& w_shape = {6, 4},
                      DType w_dtype = DType::kF32) {
    const Tensor w = full(w_shape, 7.0, w_dtype), b = full({4}, 7.0);
    CheckpointState state;
    state.add_tensor("model.w", w);
    state.add_tensor("model.b", b);
    expect_invalid([&] { checkpoint::load(state, path_); }, parts);
    EXPECT_EQ(values(w), std::vector<float>(shape_numel(w_shape), 7.0f));
    EXPECT_EQ(values(b), std::vector<float>(4, 7.0f));
  }
  TempDir dir_;
  std::string path_ = dir_ / "c";
};

TEST_F(CheckpointBadInputTest, MissingShardFile) {
  fs::remove(path_ + "/rank_00001.safetensors");
  load_expecting({"rank_00001.safetensors", "is missing", "model."});
}

TEST_F(CheckpointBadInputTest, TruncatedShardFile) {
  const std::string file = path_ + "/rank_00001.safetensors";
  fs::resize_file(file, fs::file_size(file) - 5);
  load_expecting({"rank_00001.safetensors", "truncated", "model."});
}

TEST_F(CheckpointBadInputTest, ShardFileFromAnotherCheckpoint) {
  // The same size, another header: a file swapped in from elsewhere.
  const std::string file = path_ + "/rank_00000.safetensors";
  const SafetensorsFile f = load_safetensors(file);
  TensorMap renamed;
  for (const auto& [name, t] : f.tensors) renamed.emplace(name == "model.w" ? "model.x" : name, t);
  save_safetensors(file, renamed, f.metadata);
  ASSERT_EQ(fs::file_size(file),
            checkpoint::read_checkpoint_metadata(path_).files.at("rank_00000.safetensors"));
  load_expecting({"rank_00000.safetensors", "no tensor 'model.w'"});
}

TEST_F(CheckpointBadInputTest, MetadataOfAnotherModel) {
  TempDir other;
  CheckpointState state;
  state.add_tensor("model.v", iota({3, 3}));
  checkpoint::save(state, other / "c");
  fs::copy_file(other / "c/metadata.json", path_ + "/metadata.json",
                fs::copy_options::overwrite_existing);
  load_expecting({"metadata.json", "no tensor 'model.", "model.v"});
}

TEST_F(CheckpointBadInputTest, TensorWhoseShapeOrDtypeChanged) {
  load_expecting({"metadata.json", "'model.w'", "f32[6, 4] in the checkpoint", "f32[6, 5]"},
                 {6, 5});
  load_expecting({"'model.w'", "bf16[6, 4]"}, {6, 4}, DType::kBF16);
}

TEST_F(CheckpointBadInputTest, CorruptMetadata) {
  std::ofstream(path_ + "/metadata.json") << "{\"format\": \"tessel-checkpoint\", \"version\": 9}";
  load_expecting({"metadata.json", "version 9"});
  std::ofstream(path_ + "/metadata.json") << "not json";
  load_expecting({"metadata.json", "not valid JSON"});
}

// A metadata file naming a path outside the checkpoint is refused before anything is opened.
TEST_F(CheckpointBadInputTest, ShardFilesOutsideTheFolderAreRefused) {
  std::string text;
  {
    std::ifstream in(path_ + "/metadata.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string from = "\"file\": \"rank_00000.safetensors\"";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"file\": \"../rank_00000.safetensors\"");
  std::ofstream(path_ + "/metadata.json") << text;
  load_expecting({"metadata.json", "'../rank_00000.safetensors'", "not a file name inside"});
}

// Every rank fails with the same clear error, also the ranks whose own files were fine.
TEST_F(CheckpointBadInputTest, EveryRankFailsWhenOneRanksFileIsBad) {
  fs::resize_file(path_ + "/rank_00001.safetensors", 10);
  std::atomic<int> failed{0};
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
    DTensor w = distribute_tensor(zeros({6, 4}), mesh, {Shard{0}});
    CheckpointState state(pg.shared_from_this());
    state.add_tensor("model.w", w);
    try {
      checkpoint::load(state, path_);
    } catch (const InvalidArgument& e) {
      ++failed;
      EXPECT_NE(std::string(e.what()).find(
                    pg.rank() == 1 ? "truncated"
                                   : "failed on rank 1 (see its error); nothing was loaded"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(values(w.to_local()), std::vector<float>(12, 0.0f));
  });
  EXPECT_EQ(failed.load(), 2);
}

TEST_F(CheckpointBadInputTest, PartialPlacementsAreRefused) {
  threads::run_ranks(2, [&](ProcessGroup& pg) {
    const DeviceMesh mesh = init_device_mesh(pg.shared_from_this(), {2}, {"dp"});
    CheckpointState state(pg.shared_from_this());
    state.add_tensor("p", distribute_tensor(iota({2}), mesh, {Partial{}}));
    expect_invalid([&] { checkpoint::save(state, dir_ / "p"); }, {"'p'", "Partial"});
  });
}

}  // namespace
}  // namespace tessel
