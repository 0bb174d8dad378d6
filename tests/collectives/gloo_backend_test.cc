// The Gloo backend with real processes (fork harness, FileStore rendezvous, loopback TCP): every
// collective x world sizes 1-4 x dtypes x counts, split, and faults (a rank that never calls, a
// SIGKILLed rank).

#include "tessel/collectives/gloo/gloo_backend.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>

#include "collective_checks.h"
#include "fork_harness.h"
#include "tessel/base/error.h"
#include "tessel/collectives/init.h"
#include "tessel/collectives/watchdog.h"
#include "tessel/store/file_store.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

using std::chrono::seconds;

// shared_memory = false: every collective runs Gloo's TCP algorithms (or ours over Gloo's
// point-to-point buffers) as between hosts; true: all_to_all, all_gather, reduce_scatter and
// all_reduce run as exchanges over shared memory between these ranks (all on this host).
std::shared_ptr<ProcessGroup> connect(int rank, int size, const std::string& dir,
                                      Nanoseconds timeout = seconds(30),
                                      size_t halving_max_bytes = GlooOptions{}.halving_max_bytes,
                                      bool shared_memory = true) {
  auto store = std::make_shared<FileStore>(dir, seconds(30));
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.group.timeout = timeout;
  options.halving_max_bytes = halving_max_bytes;
  options.shared_memory = shared_memory;
  return gloo::create_process_group(store, rank, size, options);
}

void expect_all_succeeded(const std::vector<testing::ProcessOutcome>& outcomes) {
  for (const auto& o : outcomes) {
    EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  }
}

class GlooBackendSweepTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  }
};

TEST_P(GlooBackendSweepTest, EveryCollectiveMatchesLocalExpectation) {
  const int size = GetParam();
  expect_all_succeeded(testing::run_processes(
      size,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, size, dir);
        testing::check_everything(*pg, testing::acceptance_counts(/*large=*/false));
      },
      seconds(90)));
}

// The same sweep with the ranks taken as on different hosts: Gloo's TCP algorithms and ours
// over its point-to-point buffers.
TEST_P(GlooBackendSweepTest, EveryCollectiveMatchesLocalExpectationOverTcp) {
  const int size = GetParam();
  expect_all_succeeded(testing::run_processes(
      size,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, size, dir, seconds(30), GlooOptions{}.halving_max_bytes,
                          /*shared_memory=*/false);
        testing::check_everything(*pg, testing::acceptance_counts(/*large=*/false));
      },
      seconds(90)));
}

TEST_P(GlooBackendSweepTest, OneMillionElements) {
  const int size = GetParam();
  expect_all_succeeded(testing::run_processes(
      size,
      [&](int rank, const std::string& dir) {
        testing::check_one_million(*connect(rank, size, dir));
      },
      seconds(150)));
}

// reduce_scatter has two algorithms; power-of-two groups run recursive halving by default.
// Here every size runs the ring (halving_max_bytes = 0), and a size above the limit in a
// split sub-group checks that split keeps the setting.
TEST_P(GlooBackendSweepTest, ReduceScatterRingOnEveryGroupSize) {
  const int size = GetParam();
  expect_all_succeeded(testing::run_processes(
      size,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, size, dir, seconds(30), /*halving_max_bytes=*/0,
                          /*shared_memory=*/false);
        for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
          for (int64_t count : {0, 1, 7, 1000}) {
            testing::check_reduce_scatter(*pg, dtype, count, false, ReduceOp::kSum);
            testing::check_reduce_scatter(*pg, dtype, count, true, ReduceOp::kAvg);
          }
        }
        auto sub = pg->split(0, rank);
        testing::check_reduce_scatter(*sub, DType::kF32, 4096, true, ReduceOp::kMax);
      },
      seconds(90)));
}

TEST_P(GlooBackendSweepTest, SplitsIntoOddColours) {
  const int size = GetParam();
  expect_all_succeeded(testing::run_processes(
      size,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, size, dir);
        testing::check_split(*pg, 3, /*with_no_color=*/false);
        testing::check_split(*pg, 2, /*with_no_color=*/size > 1);
      },
      seconds(90)));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooBackendSweepTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

// The last rank never makes collective seq 2 (`op`); every other rank must fail within the
// timeout plus a margin with an error naming the group and seq: a Timeout (which the dump hook
// saw, and which says `names` when given), or PeerLost from a peer that timed out first and
// closed its connections (Gloo's way) — at least one rank must time out.
// Both transports: shared memory between these ranks, and TCP as between hosts.
void expect_missing_rank_times_out_on(bool shared_memory, int size,
                                      const std::function<void(ProcessGroup&)>& op,
                                      const std::string& names) {
  const auto timeout = seconds(2);
  auto outcomes = testing::run_processes(
      size,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, size, dir, timeout, GlooOptions{}.halving_max_bytes, shared_memory);
        pg->barrier();  // seq 1: everyone is connected
        auto store = std::make_shared<FileStore>(dir);
        std::vector<std::string> checked;
        for (int r = 0; r + 1 < size; ++r) checked.push_back("checked/" + std::to_string(r));
        if (rank == size - 1) {  // never calls seq 2; leaves once the others checked their errors
          store->wait(checked, seconds(30));
          // Gloo closes a pair when a wait on it times out, so a rank blocked on a peer that
          // timed out before it may see that peer close and report PeerLost; but some rank
          // must have timed out.
          bool any_timeout = false;
          for (const std::string& key : checked) any_timeout |= store->get(key) == "timeout";
          if (!any_timeout) throw testing::CheckFailure("no rank reported a Timeout");
          return;
        }
        std::atomic<uint64_t> dumped_seq{0};
        Watchdog::global().set_dump_hook([&](const WatchdogEvent& e) { dumped_seq = e.seq; });
        const Stopwatch watch;
        std::string outcome = "timeout";
        auto check_names = [&](const std::string& what, const std::string& expected) {
          if (what.find("#2 on group") == std::string::npos ||
              what.find("'world'") == std::string::npos) {
            throw testing::CheckFailure("the error does not name group and seq: " + what);
          }
          if (what.find(expected) == std::string::npos) {
            throw testing::CheckFailure("the error does not say \"" + expected + "\": " + what);
          }
        };
        try {
          op(*pg);
          throw testing::CheckFailure("the collective returned without the last rank");
        } catch (const Timeout& e) {
          check_names(e.what(), names);
        } catch (const PeerLost& e) {
          check_names(e.what(), "");
          outcome = "peerlost";
        }
        // Bounded by the timeout plus a margin: no hang (not a speed assertion).
        if (watch.elapsed() > timeout + seconds(5)) {
          throw testing::CheckFailure("timeout took " + format_duration(watch.elapsed()));
        }
        if (outcome == "timeout" && dumped_seq != 2) {
          throw testing::CheckFailure("the dump hook saw seq " + std::to_string(dumped_seq));
        }
        store->set("checked/" + std::to_string(rank), outcome);
      },
      seconds(40));
  expect_all_succeeded(outcomes);
}

void expect_missing_rank_times_out(int size, const std::function<void(ProcessGroup&)>& op,
                                   const std::string& names = "") {
  for (bool shared_memory : {true, false}) {
    SCOPED_TRACE(shared_memory ? "shared memory" : "TCP");
    expect_missing_rank_times_out_on(shared_memory, size, op, names);
  }
}

TEST(GlooBackendFaultTest, RankThatNeverCallsMakesOthersTimeOut) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  expect_missing_rank_times_out(3, [](ProcessGroup& pg) {
    Tensor t = from_vector<float>({1, 2, 3});
    pg.all_reduce(t);
  });
}

// Our reduce-scatter runs over Gloo's point-to-point buffers: both of its algorithms (the ring
// on 3 ranks, recursive halving on 4) time out like Gloo's own collectives.
TEST(GlooBackendFaultTest, RankThatNeverCallsReduceScatterMakesOthersTimeOut) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  for (int size : {3, 4}) {
    expect_missing_rank_times_out(size, [size](ProcessGroup& pg) {
      Tensor in = zeros({4 * size}), out = zeros({4});
      pg.reduce_scatter(in, out);
    });
  }
}

// The list form of all_to_all over strided views (our algorithm over Gloo's point-to-point
// buffers, as is the contiguous form): the others time out naming the rank that never came.
std::vector<Tensor> columns(const Tensor& matrix, int size) {
  std::vector<Tensor> views;
  for (int j = 0; j < size; ++j) views.push_back(narrow(matrix, 1, j * 4, 4));
  return views;
}

TEST(GlooBackendFaultTest, RankThatNeverCallsAllToAllMakesOthersTimeOutNamingIt) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  for (int size : {2, 3}) {
    expect_missing_rank_times_out(
        size,
        [size](ProcessGroup& pg) {
          Tensor in = zeros({1000, 4 * size}), out = zeros({1000, 4 * size});
          pg.all_to_all(columns(in, size), columns(out, size));
        },
        fmt::format("not arrived: world rank {} (group rank {})", size - 1, size - 1));
  }
}

// A rank killed in the middle of an all_to_all of several pieces per peer: the others fail
// with the lost peer (or a communication error), long before their timeout, and do not hang.
TEST(GlooBackendFaultTest, RankKilledMidAllToAllGivesOthersAnError) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  const auto timeout = seconds(20);
  auto outcomes = testing::run_processes(
      3,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, 3, dir, timeout);
        pg->barrier();
        // 16 MiB to each peer: 64 pieces, strided on the way out.
        Tensor in = zeros({1 << 20, 12}), out = zeros({1 << 20, 12});
        if (rank == 2) {
          // Dies while its call is queued or under way (not sleeping first: on a fast host the
          // whole exchange could finish in that time): the others need all of its data, so
          // their calls cannot complete whenever the kill lands.
          pg->all_to_all(columns(in, 3), columns(out, 3), {.async = true});
          ::raise(SIGKILL);
        }
        const Stopwatch watch;
        try {
          pg->all_to_all(columns(in, 3), columns(out, 3));
          throw testing::CheckFailure("all_to_all returned without rank 2");
        } catch (const PeerLost&) {
        } catch (const CommError&) {
        }
        // An error from the lost connection, not from the timeout (not a speed assertion).
        if (watch.elapsed() >= timeout) {
          throw testing::CheckFailure("the error came only with the timeout, after " +
                                      format_duration(watch.elapsed()));
        }
      },
      seconds(60));
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[2].signal, SIGKILL) << testing::describe(outcomes[2]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(outcomes[r].exited && outcomes[r].exit_code == 0) << testing::describe(outcomes[r]);
  }
}

TEST(GlooBackendFaultTest, KilledRankGivesOthersPeerLost) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  auto outcomes = testing::run_processes(
      3,
      [&](int rank, const std::string& dir) {
        auto pg = connect(rank, 3, dir, seconds(3));
        pg->barrier();
        if (rank == 2) ::raise(SIGKILL);
        try {
          pg->barrier();
          throw testing::CheckFailure("barrier returned without rank 2");
        } catch (const PeerLost&) {
        } catch (const CommError&) {
        }
      },
      seconds(40));
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[2].signal, SIGKILL) << testing::describe(outcomes[2]);
  EXPECT_FALSE(outcomes[2].timed_out);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(outcomes[r].exited && outcomes[r].exit_code == 0) << testing::describe(outcomes[r]);
  }
}

TEST(GlooBackendInitTest, InitProcessGroupFromTorchrunEnvironment) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  expect_all_succeeded(testing::run_processes(
      3,
      [](int rank, const std::string& dir) {
        ::setenv("RANK", std::to_string(rank).c_str(), 1);
        ::setenv("WORLD_SIZE", "3", 1);
        ::setenv("TESSEL_STORE_DIR", dir.c_str(), 1);
        auto pg = init_process_group({.gloo = {.hostname = "127.0.0.1"}});
        if (pg->backend_name() != "gloo" || pg->rank() != rank || pg->size() != 3) {
          throw testing::CheckFailure("init_process_group made the wrong group");
        }
        testing::check_all_reduce(*pg, DType::kF32, 5, ReduceOp::kSum);
      },
      seconds(40)));
}

// TESSEL_STORE_DIR made once (mkdir -p) and used by run after run: each run rendezvouses
// under its own prefix instead of dialling the previous run's processes.
TEST(GlooBackendInitTest, FileStoreDirectoryServesReruns) {
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend";
  char pattern[] = "/tmp/tessel-rerun-XXXXXX";
  const std::string dir = ::mkdtemp(pattern);
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(fmt::format("run {}", run + 1));
    expect_all_succeeded(testing::run_processes(
        2,
        [&](int rank, const std::string&) {
          ::setenv("RANK", std::to_string(rank).c_str(), 1);
          ::setenv("WORLD_SIZE", "2", 1);
          ::setenv("TESSEL_STORE_DIR", dir.c_str(), 1);
          auto pg = init_process_group({.timeout = seconds(20), .gloo = {.hostname = "127.0.0.1"}});
          testing::check_all_reduce(*pg, DType::kF32, 5, ReduceOp::kSum);
        },
        seconds(40)));
  }
  // Two earlier runs whose rank 0 never started: rank 1 counts more runs than rank 0 will, and
  // rank 0 refuses at once with the reason instead of dialling a stale address.
  FileStore(dir).add("runs/rank_1", 2);
  const auto outcomes = testing::run_processes(
      2,
      [&](int rank, const std::string&) {
        ::setenv("RANK", std::to_string(rank).c_str(), 1);
        ::setenv("WORLD_SIZE", "2", 1);
        ::setenv("TESSEL_STORE_DIR", dir.c_str(), 1);
        try {
          init_process_group({.timeout = seconds(3), .gloo = {.hostname = "127.0.0.1"}});
        } catch (const Unavailable& e) {
          if (rank == 0 &&
              std::string(e.what()).find("an earlier run stopped") != std::string::npos) {
            return;
          }
          throw;
        }
        if (rank == 0) throw testing::CheckFailure("rank 0 joined a run its peer is not in");
      },
      seconds(40));
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_TRUE(outcomes[0].exited && outcomes[0].exit_code == 0) << testing::describe(outcomes[0]);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessel
