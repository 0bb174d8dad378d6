// Collectives issued off the training loop's thread, over real processes (3 ranks, Gloo, 2 s
// collective timeouts): the asynchronous checkpoint writer, and a user thread. One rank stops
// (SIGSTOP) while the others are in such a collective. The others must end within the
// collective timeout plus a generous margin (a hang check, not a speed check), with dumps whose
// verdict names only the stopped rank and the purpose of the thread that waited, and with the
// writer's entries attributed to it rather than to the training step.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/parallel/checkpoint/checkpoint.h"
#include "tessel/parallel/checkpoint/internal/files.h"
#include "tessel/tensor/ops.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/fr_fault_util.h"
#include "tests/parallel/checkpoint_test_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kWorld = 3;
constexpr int kStopped = 1;
constexpr auto kCollectiveTimeout = 2s;  // join_fr_world's
// What a rank may take beyond the collective timeout to see the failure: the watchdog's grace,
// the dump, and a loaded 2-core machine.
constexpr auto kMargin = 10s;

struct Job {
  std::vector<testing::ProcessOutcome> outcomes;
  fr::DumpSet dumps;
  fr::Verdict verdict;
  std::string text;
};

// Stops the calling process (SIGSTOP) after leaving its pid where rank 0 finds it.
void stop_self(const std::string& store_dir) {
  const fs::path pid_file = fs::path(store_dir) / "stopped_rank.pid";
  std::ofstream(pid_file.string() + ".tmp") << ::getpid();
  fs::rename(pid_file.string() + ".tmp", pid_file);
  ::raise(SIGSTOP);
}

// Ranks other than the stopped one: once both dumped, rank 0 SIGKILLs the stopped rank.
void dump_then_end_stopped(int rank, const std::string& store_dir, const fs::path& dir) {
  testing::wait_for_fr_dumps(dir, {0, 2}, rank);
  if (rank != 0) return;
  const fs::path pid_file = fs::path(store_dir) / "stopped_rank.pid";
  ASSERT_TRUE(testing::wait_until([&] { return fs::exists(pid_file); }, 20s));
  int pid = 0;
  std::ifstream(pid_file) >> pid;
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
}

Job run_job(const std::string& name,
            const std::function<void(int, std::shared_ptr<ProcessGroup>, const std::string&,
                                     const fs::path&)>& body) {
  const fs::path dir = testing::fresh_fr_dir(name);
  Job job;
  job.outcomes = testing::run_processes(
      kWorld,
      [&](int rank, const std::string& store_dir) {
        auto world = testing::join_fr_world(rank, kWorld, store_dir, dir);
        body(rank, world, store_dir, dir);
        testing::exit_failed_if_assertions_failed(rank);
      },
      60s);
  job.dumps = fr::read_dump_dir(dir);
  job.verdict = testing::analyze_fr_dir(dir);
  job.text = fr::format_verdict(job.verdict);
  fs::remove_all(dir);
  return job;
}

// The stopped rank was killed; the others ended on their own, cleanly; the verdict blames the
// stopped rank alone, for not joining, and says which thread the others waited in.
void expect_only_the_stopped_rank_blamed(const Job& job, const std::string& waited_in) {
  ASSERT_EQ(job.outcomes.size(), static_cast<size_t>(kWorld));
  for (const auto& o : job.outcomes) {
    if (o.rank == kStopped) {
      EXPECT_EQ(o.signal, SIGKILL) << testing::describe(o);
    } else {
      EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
    }
  }
  EXPECT_EQ(job.verdict.status, fr::VerdictStatus::kCulpritFound) << job.text;
  EXPECT_EQ(job.verdict.culprits, std::vector<int>{kStopped}) << job.text;
  EXPECT_TRUE(job.verdict.suspects.empty()) << job.text;
  bool not_joined = false;
  for (const auto& f : job.verdict.findings) {
    EXPECT_EQ(f.culprits, std::vector<int>{kStopped}) << job.text;
    not_joined |= f.kind == fr::FindingKind::kNotJoined;
  }
  EXPECT_TRUE(not_joined) << job.text;
  EXPECT_NE(job.text.find(waited_in), std::string::npos) << "no '" << waited_in << "' in\n"
                                                         << job.text;
}

// Ranks 0 and 2 train three steps, then save asynchronously; rank 1's writer stops the process
// as its commit begins. The writer's collective times out, both dump, and the main thread's
// wait() rethrows within the collective timeout plus the margin.
TEST(BackgroundWorkTest, StalledRankDuringAsyncCheckpointEndsTheJob) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const testing::TempDir root;
  const Job job = run_job("bg_ckpt", [&](int rank, std::shared_ptr<ProcessGroup> world,
                                         const std::string& store_dir, const fs::path& dir) {
    Tensor r = full({16}, static_cast<double>(rank));
    checkpoint::CheckpointState state(world);
    state.add_tensor("r", r);
    {
      checkpoint::Checkpointer ckpt(world, root.str(), {.timeout = kCollectiveTimeout});
      for (int64_t step = 0; step < 3; ++step) {
        fr::FlightRecorder::global().set_step(step);
        Tensor t = from_vector<float>({1.0f});
        world->all_reduce(t);
      }
      if (rank == kStopped) {
        checkpoint::internal::set_fault_hook([&](std::string_view point) {
          if (point == "commit.begin") stop_self(store_dir);
        });
      }
      state.step = 3;
      const auto start = std::chrono::steady_clock::now();
      ckpt.async_save(state);
      if (rank == kStopped) {
        ckpt.wait();  // the writer stops the process; rank 0 kills it
        ADD_FAILURE() << "the stopped rank ran again";
        return;
      }
      EXPECT_THROW(ckpt.wait(), Error);
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_LT(took, kCollectiveTimeout + kMargin)
          << "wait() took " << format_duration(std::chrono::duration_cast<Nanoseconds>(took));
    }  // the Checkpointer and its private group go here
    dump_then_end_stopped(rank, store_dir, dir);
  });
  expect_only_the_stopped_rank_blamed(job, "(checkpoint writer thread, no step");
  // The writer's entries are its own (no training step); the loop's carry their steps.
  for (const auto& d : job.dumps.dumps) {
    if (d.rank == kStopped) continue;
    int writer = 0, stepped = 0;
    for (const auto& e : d.entries) {
      if (e.purpose == "checkpoint writer") {
        ++writer;
        EXPECT_EQ(e.step, -1) << "rank " << d.rank << " record " << e.record_id;
      } else if (e.op == fr::OpType::kAllReduce) {
        EXPECT_EQ(e.purpose, "");
        stepped += e.step >= 0;
      }
    }
    EXPECT_GE(writer, 1) << "rank " << d.rank;
    EXPECT_EQ(stepped, 3) << "rank " << d.rank;
  }
}

// A user thread (ThreadScope "eval") queues eight asynchronous all_reduces on its own group and
// drops the group; rank 1 stops before joining them. The first times out; the seven still
// queued must not each wait out a timeout against the stopped peer (the group's destructor
// fails them unrun; Gloo's pairs also fail fast once one timed out), so every Work has failed,
// and the thread is joined, within the collective timeout plus the margin.
TEST(BackgroundWorkTest, UserThreadCollectiveWithAStalledPeerEndsTheJob) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const Job job = run_job("bg_user", [&](int rank, std::shared_ptr<ProcessGroup> world,
                                         const std::string& store_dir, const fs::path& dir) {
    for (int64_t step = 0; step < 2; ++step) {
      fr::FlightRecorder::global().set_step(step);
      Tensor t = from_vector<float>({1.0f});
      world->all_reduce(t);
    }
    std::shared_ptr<ProcessGroup> eval = world->split(0, rank, {.name = "eval"});
    if (rank == kStopped) {
      stop_self(store_dir);
      ADD_FAILURE() << "the stopped rank ran again";
      return;
    }
    int failed = 0;
    const auto start = std::chrono::steady_clock::now();
    std::thread user([&] {
      fr::ThreadScope scope("eval");
      std::vector<Tensor> metrics;
      std::vector<Work> works;
      for (int i = 0; i < 8; ++i) {
        metrics.push_back(from_vector<float>({static_cast<float>(i)}));
        works.push_back(eval->all_reduce(metrics.back(), {.async = true}));
      }
      eval.reset();  // the last reference: the group goes with its queue still full
      for (Work& w : works) {
        try {
          w.wait();
        } catch (const Error&) {
          ++failed;
        }
      }
    });
    user.join();
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(failed, 8);
    EXPECT_LT(took, kCollectiveTimeout + kMargin)
        << "the user thread took "
        << format_duration(std::chrono::duration_cast<Nanoseconds>(took));
    dump_then_end_stopped(rank, store_dir, dir);
  });
  expect_only_the_stopped_rank_blamed(job, "(eval thread, no step");
}

}  // namespace
}  // namespace tessel
