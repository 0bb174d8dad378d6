// Crash safety of checkpoint saves with real processes: 3 ranks over Gloo (forked, FileStore
// rendezvous) save periodically with keep-last-2 retention while one rank SIGKILLs itself —
// at every named step of the commit protocol, and at random moments. Afterwards the latest
// committed checkpoint must load and hold the values of its step, every step_<N> folder must be
// complete, and a restarted job must resume from it and save again (clearing the crashed save's
// leftovers).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/internal/files.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/ops.h"
#include "tests/collectives/fork_harness.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointState;
using testing::TempDir;

constexpr int kWorld = 3;
constexpr int64_t kRows = 3 * 200, kCols = 1024;  // 2.4 MB of w, 0.8 MB per rank
constexpr auto kTimeout = std::chrono::seconds(15);

// Step `step`'s values: w[i, j] = 1000 * step + i (sharded by rows), r = -step (on every rank).
Tensor w_rows(int64_t step, int64_t first_row, int64_t rows) {
  const Tensor col = reshape(arange(static_cast<double>(first_row),
                                    static_cast<double>(first_row + rows), 1.0, DType::kF32),
                             {rows, 1});
  return contiguous(expand(add(col, 1000.0 * static_cast<double>(step)), {rows, kCols}));
}

std::shared_ptr<ProcessGroup> gloo_world(int rank, const std::string& store_dir) {
  auto store = std::make_shared<FileStore>(store_dir);
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.group.timeout = kTimeout;
  return gloo::create_process_group(store, rank, kWorld, options);
}

// One rank of the job: its shard of w, the replicated r, a generator, and the checkpointer of
// `root` (keep-last-2).
struct RankState {
  RankState(int rank, const std::string& store_dir, const std::string& root)
      : world(gloo_world(rank, store_dir)),
        mesh(init_device_mesh(world, {kWorld}, {"dp"})),
        w(distribute_tensor(zeros({kRows, kCols}), mesh, {Shard{0}})),
        r(zeros({64, kCols})),
        state(world),
        ckpt(state.group(), root, {.keep_last = 2, .timeout = kTimeout}) {
    state.add_tensor("w", w);
    state.add_tensor("r", r);
    state.add_generator("data", gen);
  }
  void set_step(int64_t step) {
    copy_(w.to_local(), w_rows(step, w.local_offset()[0], w.local_shape()[0]));
    fill_(r, -static_cast<double>(step));
    gen.manual_seed(7);
    gen.reserve(static_cast<uint64_t>(step));
    state.step = step;
  }
  std::shared_ptr<ProcessGroup> world;
  DeviceMesh mesh;
  DTensor w;
  Tensor r;
  Generator gen;
  CheckpointState state;
  checkpoint::Checkpointer ckpt;
};

// In a forked child (the parent starts no threads): every step_<N> folder loads in one process
// and holds step N's values; returns through the exit status. `expect_latest` >= 0: the latest
// must be that step.
void check_checkpoints(const std::string& root, int64_t expect_latest) {
  const auto outcomes = testing::run_processes(
      1,
      [&](int, const std::string&) {
        const auto list = checkpoint::list_checkpoints(root);
        TESSEL_CHECK(!list.empty(), InvalidArgument, "no committed checkpoint under {}", root);
        TESSEL_CHECK(expect_latest < 0 || list.back().first == expect_latest, InvalidArgument,
                     "latest checkpoint is step {}, expected step {}", list.back().first,
                     expect_latest);
        for (const auto& [step, dir] : list) {
          const Tensor w = zeros({kRows, kCols}), r = zeros({64, kCols});
          Generator gen;
          CheckpointState state;
          state.add_tensor("w", w);
          state.add_tensor("r", r);
          state.add_generator("data", gen);
          checkpoint::load(state, dir);
          TESSEL_CHECK(state.step == step, InvalidArgument, "{} records step {}", dir, state.step);
          TESSEL_CHECK(to_vector<float>(w) == to_vector<float>(w_rows(step, 0, kRows)) &&
                           to_vector<float>(r) == std::vector<float>(64 * kCols, -step) &&
                           gen.offset() == static_cast<uint64_t>(step),
                       InvalidArgument, "{} does not hold the values of step {}", dir, step);
        }
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(outcomes[0].exited && outcomes[0].exit_code == 0) << testing::describe(outcomes[0]);
}

// Survivors may fail (their peer died) but must not hang.
void expect_victim_killed(const std::vector<testing::ProcessOutcome>& outcomes, int victim,
                          bool must_die) {
  for (const auto& o : outcomes) {
    EXPECT_FALSE(o.timed_out) << testing::describe(o);
    if (o.rank == victim && must_die) {
      EXPECT_EQ(o.signal, SIGKILL) << testing::describe(o);
    }
  }
}

struct Point {
  std::string name;
  int victim;
  int64_t latest;  // the latest committed step afterwards
};

// The victim kills itself at one named step of the second save; only the steps after the
// rename may leave the second checkpoint as the latest.
TEST(CheckpointCrashTest, KillAtEveryStepOfTheCommitLeavesTheLatestCommittedLoadable) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const std::vector<Point> points = {
      {"commit.begin", 1, 1},    {"write.begin", 1, 1},  {"write.mid", 1, 1},
      {"write.end", 1, 1},       {"commit.begin", 0, 1}, {"write.mid", 0, 1},
      {"metadata.begin", 0, 1},  {"rename.begin", 0, 1}, {"rename.end", 0, 2},
      {"retention.begin", 0, 2},
  };
  for (const Point& p : points) {
    SCOPED_TRACE(fmt::format("rank {} killed at {}", p.victim, p.name));
    TempDir root;
    const auto outcomes = testing::run_processes(
        kWorld,
        [&](int rank, const std::string& store_dir) {
          RankState s(rank, store_dir, root.str());
          s.set_step(1);
          s.ckpt.save(s.state);
          if (rank == p.victim) {
            checkpoint::internal::set_fault_hook([&](std::string_view point) {
              if (point == p.name) ::raise(SIGKILL);
            });
          }
          s.set_step(2);
          s.ckpt.save(s.state);
        },
        std::chrono::seconds(60));
    expect_victim_killed(outcomes, p.victim, /*must_die=*/true);
    check_checkpoints(root.str(), p.latest);
  }
}

// The victim (a random rank) kills itself at a random moment of four consecutive saves; then
// the job restarts, resumes from the latest committed checkpoint and commits a new one.
TEST(CheckpointCrashTest, KillAtRandomMomentsThenResume) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  std::mt19937_64 rng(16);
  for (int trial = 0; trial < 6; ++trial) {
    const int victim = static_cast<int>(rng() % kWorld);
    const double fraction = std::uniform_real_distribution<double>(0, 1)(rng);
    SCOPED_TRACE(
        fmt::format("trial {}: rank {} killed at {:.2f} of 4 saves", trial, victim, fraction));
    TempDir root;
    const auto outcomes = testing::run_processes(
        kWorld,
        [&](int rank, const std::string& store_dir) {
          RankState s(rank, store_dir, root.str());
          s.set_step(1);
          const auto start = std::chrono::steady_clock::now();
          s.ckpt.save(s.state);
          const auto one_save = std::chrono::steady_clock::now() - start;
          std::optional<std::jthread> killer;
          if (rank == victim) {
            killer.emplace([delay = one_save * 4 * fraction] {
              std::this_thread::sleep_for(delay);
              ::raise(SIGKILL);
            });
          }
          for (int64_t step = 2; step <= 5; ++step) {
            s.set_step(step);
            s.ckpt.async_save(s.state);
          }
          s.ckpt.wait();
          if (killer) killer->join();  // the victim dies here at the latest
        },
        std::chrono::seconds(60));
    expect_victim_killed(outcomes, victim, /*must_die=*/false);
    check_checkpoints(root.str(), -1);

    // The restarted job resumes where the latest checkpoint left it and saves again.
    const auto restarted = testing::run_processes(
        kWorld,
        [&](int rank, const std::string& store_dir) {
          RankState s(rank, store_dir, root.str());
          const auto dir = s.ckpt.load_latest(s.state);
          TESSEL_CHECK(dir.has_value() && s.state.step >= 1, InvalidArgument, "nothing resumed");
          TESSEL_CHECK(to_vector<float>(s.w.to_local()) ==
                           to_vector<float>(
                               w_rows(s.state.step, s.w.local_offset()[0], s.w.local_shape()[0])),
                       InvalidArgument, "rank {} resumed other values than step {}'s", rank,
                       s.state.step);
          s.set_step(10);
          s.ckpt.save(s.state);
        },
        std::chrono::seconds(60));
    for (const auto& o : restarted)
      EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
    check_checkpoints(root.str(), 10);
    for (const auto& entry : fs::directory_iterator(root.str())) {
      EXPECT_FALSE(entry.path().filename().string().starts_with("."))
          << "leftover " << entry.path();
    }
  }
}

}  // namespace
}  // namespace tessel
