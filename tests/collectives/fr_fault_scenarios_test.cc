// Flight-recorder fault injection, continued (fr_fault_test.cc has the skipped all_reduce and the
// SIGKILLed rank): each test forks a real Gloo job, injects one fault, gathers every live rank's
// dump (through the store when a collective fails, by the API where the job ends) and asserts the
// analyzer's verdict: the exact culprits, and that no healthy rank is blamed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fork_harness.h"
#include "fr_fault_util.h"
#include "tessel/collectives/gloo/gloo_backend.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct JobResult {
  std::vector<testing::ProcessOutcome> outcomes;
  fr::DumpSet dumps;
  fr::Verdict verdict;
};

// Runs `body(rank, world, store_dir)` on every rank of a Gloo world of `world_size` processes;
// then the rank writes an API dump (a job that finished its work dumps at the end, so what it
// did is on record even when the backend did not notice the fault) unless `api_dump` is false,
// and stays alive until every rank in `dumpers` has dumped. Analyzes the dumps.
JobResult run_job(const std::string& name, int world_size,
                  const std::function<void(int, ProcessGroup&, const std::string&)>& body,
                  std::vector<int> dumpers = {}, bool api_dump = true) {
  if (dumpers.empty()) dumpers = testing::all_ranks(world_size);
  const fs::path dir = testing::fresh_fr_dir(name);
  JobResult result;
  result.outcomes = testing::run_processes(
      world_size,
      [&](int rank, const std::string& store_dir) {
        auto world = testing::join_fr_world(rank, world_size, store_dir, dir);
        body(rank, *world, store_dir);
        if (api_dump) testing::api_dump(dir, rank, "end of job");
        testing::wait_for_fr_dumps(dir, dumpers, rank);
        testing::exit_failed_if_assertions_failed(rank);
      },
      60s);
  result.dumps = fr::read_dump_dir(dir);
  result.verdict = testing::analyze_fr_dir(dir);
  fs::remove_all(dir);
  return result;
}

void expect_all_exited(const JobResult& job) {
  for (const auto& o : job.outcomes) {
    EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  }
}

// A mismatched size or dtype can make Gloo's I/O thread throw on a receiver ("op.preamble.length
// <= op.nbytes"), which terminates that healthy process (SIGABRT); its fatal-signal handler still
// dumps. Every rank either exited cleanly or died that way, and every rank left a dump.
//
// Gloo then writes to the dead rank's socket. With SIGPIPE's default disposition that kills the
// writer on the spot, with no dump (SIGPIPE is not a dump signal), and the analyzer, seeing no
// dump, rightly names it as not having joined: a healthy rank blamed. So ranks that take part
// in a mismatch ignore SIGPIPE, as a process using Gloo must (see the report: the Gloo backend
// does not do it for them), and get EPIPE instead.
void ignore_sigpipe() { ::signal(SIGPIPE, SIG_IGN); }
void expect_exited_or_aborted_with_dumps(const JobResult& job) {
  for (const auto& o : job.outcomes) {
    EXPECT_TRUE((o.exited && o.exit_code == 0) || (!o.timed_out && o.signal == SIGABRT))
        << testing::describe(o);
  }
  EXPECT_EQ(job.verdict.dumps, static_cast<int>(job.outcomes.size()))
      << fr::format_verdict(job.verdict);
}

// The verdict names exactly `culprits`, and at least one finding of `kind` names them.
void expect_culprits(const fr::Verdict& v, const std::vector<int>& culprits, fr::FindingKind kind) {
  EXPECT_EQ(v.status, fr::VerdictStatus::kCulpritFound) << fr::format_verdict(v);
  EXPECT_EQ(v.culprits, culprits) << fr::format_verdict(v);
  const bool found = std::any_of(v.findings.begin(), v.findings.end(), [&](const fr::Finding& f) {
    return f.kind == kind && f.culprits == culprits;
  });
  EXPECT_TRUE(found) << "no " << fr::finding_kind_name(kind) << " finding\n"
                     << fr::format_verdict(v);
}

// Runs `op`, which may fail (a mismatch can make Gloo error, time out, or pass unnoticed).
void tolerate_failure(const std::function<void()>& op) {
  try {
    op();
  } catch (const Error&) {
  }
}

#define TESSEL_REQUIRE_GLOO() \
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend"

TEST(FlightRecorderFaultTest, RankThatCallsAnExtraCollectiveIsNamed) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "extra", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        Tensor t = from_vector<float>({1.0f});
        world.all_reduce(t);
        world.all_reduce(t);
        if (rank == 1) {
          EXPECT_THROW(world.all_reduce(t), Error);  // nobody else calls it
        }
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_culprits(job.verdict, {1}, fr::FindingKind::kExtraCollective);
}

TEST(FlightRecorderFaultTest, SizeMismatchBlamesTheMinority) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job("size", 4, [](int rank, ProcessGroup& world, const std::string&) {
    ignore_sigpipe();
    Tensor t = zeros({16});
    world.all_reduce(t);
    Tensor odd = zeros({rank == 2 ? 32 : 16});
    tolerate_failure([&] { world.all_reduce(odd); });
  });
  expect_exited_or_aborted_with_dumps(job);
  expect_culprits(job.verdict, {2}, fr::FindingKind::kMismatch);
}

TEST(FlightRecorderFaultTest, DtypeMismatchBlamesTheMinority) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job("dtype", 4, [](int rank, ProcessGroup& world, const std::string&) {
    ignore_sigpipe();
    Tensor t = zeros({16});
    world.all_reduce(t);
    Tensor odd = zeros({16}, rank == 3 ? DType::kI64 : DType::kF32);
    tolerate_failure([&] { world.all_reduce(odd); });
  });
  expect_exited_or_aborted_with_dumps(job);
  expect_culprits(job.verdict, {3}, fr::FindingKind::kMismatch);
}

TEST(FlightRecorderFaultTest, ReduceOpMismatchBlamesTheMinority) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job("redop", 3, [](int rank, ProcessGroup& world, const std::string&) {
    Tensor t = from_vector<float>({1.0f, 2.0f});
    world.all_reduce(t);
    tolerate_failure(
        [&] { world.all_reduce(t, {.op = rank == 0 ? ReduceOp::kMax : ReduceOp::kSum}); });
  });
  expect_all_exited(job);
  expect_culprits(job.verdict, {0}, fr::FindingKind::kMismatch);
}

TEST(FlightRecorderFaultTest, BroadcastRootMismatchBlamesTheMinority) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job("root", 4, [](int rank, ProcessGroup& world, const std::string&) {
    Tensor t = from_vector<float>({1.0f, 2.0f});
    world.all_reduce(t);
    tolerate_failure([&] { world.broadcast(t, {.root = rank == 1 ? 1 : 0}); });
  });
  expect_all_exited(job);
  expect_culprits(job.verdict, {1}, fr::FindingKind::kMismatch);
}

// The inconclusive verdict of a symmetric fault: nobody blamed, the two sides named as suspects,
// and the words saying why.
void expect_symmetric(const fr::Verdict& v, const std::vector<int>& suspects,
                      const std::string& words) {
  EXPECT_EQ(v.status, fr::VerdictStatus::kInconclusive) << fr::format_verdict(v);
  EXPECT_TRUE(v.culprits.empty()) << fr::format_verdict(v);
  EXPECT_EQ(v.suspects, suspects) << fr::format_verdict(v);
  EXPECT_NE(fr::format_verdict(v).find(words), std::string::npos) << fr::format_verdict(v);
}

// Groups A = {0,1,2} and B = {0,1,3}; rank 0 enters A then B, rank 1 B then A. Ranks 0 and 2
// wait in A for rank 1, ranks 1 and 3 wait in B for rank 0: a cycle between 0 and 1. Only they
// take part in both groups, so nothing tells which order was meant: both are suspects, and
// neither is blamed.
TEST(FlightRecorderFaultTest, OppositeGroupOrdersAreADeadlock) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "deadlock", 4,
      [](int rank, ProcessGroup& world, const std::string&) {
        auto a = world.split(rank == 3 ? kNoColor : 0, rank, {.name = "a"});
        auto b = world.split(rank == 2 ? kNoColor : 0, rank, {.name = "b"});
        Tensor t = from_vector<float>({1.0f});
        if (rank == 0 || rank == 2) {
          EXPECT_THROW(a->all_reduce(t), Error);
        }
        if (rank == 1 || rank == 3) {
          EXPECT_THROW(b->all_reduce(t), Error);
        }
        // Rank 0 would go on to B and rank 1 to A, had their first collective completed.
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_symmetric(job.verdict, {0, 1}, "ranks 0,1 each wait for the other");
  expect_symmetric(job.verdict, {0, 1}, "nothing tells which of them deviated");
}

// The synthetic generator's deadlock on a real job: ranks 0 and 1 issue a world all_reduce and
// one on their pair in opposite orders; rank 2 only waits. Only ranks 0 and 1 take part in both,
// so the order cannot be settled: both suspects, nobody blamed.
TEST(FlightRecorderFaultTest, WorldAndPairInOppositeOrdersBlameThePair) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "deadlock_pair", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        auto pair = world.split(rank == 2 ? kNoColor : 0, rank, {.name = "pair"});
        Tensor t = from_vector<float>({1.0f});
        if (rank == 1) {
          EXPECT_THROW(pair->all_reduce(t), Error);
        } else {
          EXPECT_THROW(world.all_reduce(t), Error);
        }
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_symmetric(job.verdict, {0, 1}, "ranks 0,1 each wait for the other");
}

// A rank in two groups dies: the members of both groups wait for it, and only it is blamed.
TEST(FlightRecorderFaultTest, KilledRankInTwoGroupsIsTheOnlyCulprit) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "kill_two_groups", 4,
      [](int rank, ProcessGroup& world, const std::string&) {
        auto trio = world.split(rank == 3 ? kNoColor : 0, rank, {.name = "trio"});
        Tensor t = from_vector<float>({1.0f});
        world.all_reduce(t);
        if (rank == 1) ::raise(SIGKILL);  // no dump from it
        if (rank == 3) {
          EXPECT_THROW(world.all_reduce(t), Error);
        } else {
          EXPECT_THROW(trio->all_reduce(t), Error);
        }
      },
      {0, 2, 3}, /*api_dump=*/false);
  ASSERT_EQ(job.outcomes.size(), 4u);
  EXPECT_EQ(job.outcomes[1].signal, SIGKILL) << testing::describe(job.outcomes[1]);
  for (int r : {0, 2, 3}) {
    const auto& o = job.outcomes[static_cast<size_t>(r)];
    EXPECT_TRUE(o.exited && o.exit_code == 0) << testing::describe(o);
  }
  expect_culprits(job.verdict, {1}, fr::FindingKind::kNotJoined);
}

TEST(FlightRecorderFaultTest, SendWithoutItsRecvBlamesTheReceiver) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "send", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        Tensor t = from_vector<float>({1.0f, 2.0f, 3.0f});
        world.all_reduce(t);
        if (rank == 0) {
          EXPECT_THROW(world.send(t, 2), Error);  // rank 2 never posts the recv
        }
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_culprits(job.verdict, {2}, fr::FindingKind::kUnmatchedSend);
  const std::string text = fr::format_verdict(job.verdict);
  EXPECT_NE(text.find("send #1 from rank 0 to rank 2 in group 'world' has no matching recv: rank "
                      "2 never posted it"),
            std::string::npos)
      << text;
}

TEST(FlightRecorderFaultTest, RecvWithoutItsSendBlamesTheSender) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "recv", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        Tensor t = from_vector<float>({1.0f, 2.0f, 3.0f});
        world.all_reduce(t);
        if (rank == 2) {
          EXPECT_THROW(world.recv(t, 1), Error);  // rank 1 never sends
        }
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_culprits(job.verdict, {1}, fr::FindingKind::kUnmatchedRecv);
  // A receive is described as a receive, from the side that waits in it.
  const std::string text = fr::format_verdict(job.verdict);
  EXPECT_NE(text.find("recv #1 at rank 2 from rank 1 in group 'world' has no matching send: rank "
                      "1 never posted it"),
            std::string::npos)
      << text;
}

// The receiver that never posted its recv moves on to the next all_reduce, which the sender,
// stuck in its send, never issues: a cycle through a send, whose missing recv is the cause.
TEST(FlightRecorderFaultTest, ReceiverThatMovedOnIsBlamedForTheSend) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "send_cycle", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        Tensor t = from_vector<float>({1.0f, 2.0f, 3.0f});
        world.all_reduce(t);
        if (rank == 0) {
          EXPECT_THROW(world.send(t, 2), Error);
        } else {
          EXPECT_THROW(world.all_reduce(t), Error);  // rank 2 should have received first
        }
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_culprits(job.verdict, {2}, fr::FindingKind::kUnmatchedSend);
}

TEST(FlightRecorderFaultTest, DifferentCollectiveAtOneSeqBlamesTheMinority) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job("opkind", 4, [](int rank, ProcessGroup& world, const std::string&) {
    ignore_sigpipe();
    Tensor t = from_vector<float>({1.0f, 2.0f});
    world.all_reduce(t);
    tolerate_failure([&] {
      if (rank == 3) {
        world.broadcast(t, {.root = 0});
      } else {
        world.all_reduce(t);
      }
    });
  });
  expect_exited_or_aborted_with_dumps(job);
  expect_culprits(job.verdict, {3}, fr::FindingKind::kMismatch);
}

TEST(FlightRecorderFaultTest, StoppedRankWithoutADumpIsNamed) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "stop", 3,
      [](int rank, ProcessGroup& world, const std::string& store_dir) {
        const fs::path pid_file = fs::path(store_dir) / "stopped_rank.pid";
        Tensor t = from_vector<float>({1.0f});
        world.all_reduce(t);
        if (rank == 1) {
          std::ofstream(pid_file.string() + ".tmp") << ::getpid();
          fs::rename(pid_file.string() + ".tmp", pid_file);
          ::raise(SIGSTOP);  // stopped: no dump; rank 0 SIGKILLs it once the others dumped
          ADD_FAILURE() << "the stopped rank ran again";
          return;
        }
        EXPECT_THROW(world.all_reduce(t), Error);
        testing::wait_for_fr_dumps(fs::path(::getenv("TESSEL_FR_DUMP_DIR")), {0, 2}, rank);
        if (rank == 0) {
          ASSERT_TRUE(testing::wait_until([&] { return fs::exists(pid_file); }, 20s));
          int pid = 0;
          std::ifstream(pid_file) >> pid;
          ASSERT_GT(pid, 0);
          ::kill(pid, SIGKILL);
        }
      },
      {0, 2}, /*api_dump=*/false);
  ASSERT_EQ(job.outcomes.size(), 3u);
  EXPECT_EQ(job.outcomes[1].signal, SIGKILL) << testing::describe(job.outcomes[1]);
  EXPECT_TRUE(job.outcomes[0].exited && job.outcomes[0].exit_code == 0)
      << testing::describe(job.outcomes[0]);
  EXPECT_TRUE(job.outcomes[2].exited && job.outcomes[2].exit_code == 0)
      << testing::describe(job.outcomes[2]);
  expect_culprits(job.verdict, {1}, fr::FindingKind::kNotJoined);
  EXPECT_EQ(job.verdict.positions.at(1).where, fr::RankPosition::Where::kNoDump);
}

TEST(FlightRecorderFaultTest, SlowButLiveRankIsTheOnlyStraggler) {
  TESSEL_REQUIRE_GLOO();
  constexpr int kRounds = 20;
  const auto job = run_job("straggler", 3, [](int rank, ProcessGroup& world, const std::string&) {
    Tensor t = from_vector<float>({1.0f});
    for (int i = 0; i < kRounds; ++i) {
      // The fault itself: rank 2 computes 80 ms longer before every all_reduce.
      if (rank == 2) std::this_thread::sleep_for(80ms);
      world.all_reduce(t);
    }
  });
  expect_all_exited(job);
  // A straggler is information on a healthy verdict. Arrival times are wall-clock: on a loaded
  // machine the report may miss rank 2, but it never names another rank.
  const fr::Verdict& v = job.verdict;
  EXPECT_EQ(v.status, fr::VerdictStatus::kHealthy) << fr::format_verdict(v);
  EXPECT_TRUE(v.culprits.empty()) << fr::format_verdict(v);
  for (const auto& s : v.stragglers) EXPECT_EQ(s.rank, 2) << fr::format_verdict(v);
}

TEST(FlightRecorderFaultTest, WrappedRingStillNamesTheRankThatSkipped) {
  TESSEL_REQUIRE_GLOO();
  // The ranks are forked from here, so they make their recorder with this capacity.
  ::setenv("TESSEL_FR_CAPACITY", "8", 1);
  constexpr int kBefore = 50;  // far more than the ring holds
  const auto job = run_job(
      "wrapped", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        ASSERT_EQ(fr::FlightRecorder::global().capacity(), 8u);
        Tensor t = from_vector<float>({1.0f});
        for (int i = 0; i < kBefore; ++i) world.all_reduce(t);
        if (rank != 0) {
          EXPECT_THROW(world.all_reduce(t), Error);  // rank 0 skips it
        }
      },
      {}, /*api_dump=*/false);
  ::unsetenv("TESSEL_FR_CAPACITY");
  expect_all_exited(job);
  expect_culprits(job.verdict, {0}, fr::FindingKind::kNotJoined);
}

TEST(FlightRecorderFaultTest, TwoRanksThatSkipAreBothNamed) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "skip_two", 5,
      [](int rank, ProcessGroup& world, const std::string&) {
        Tensor t = from_vector<float>({1.0f});
        world.all_reduce(t);
        if (rank != 1 && rank != 3) {
          EXPECT_THROW(world.all_reduce(t), Error);  // ranks 1 and 3 never join
        }
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  expect_culprits(job.verdict, {1, 3}, fr::FindingKind::kNotJoined);
}

// A dump of a live job: ranks 0 and 1 dump (from a second thread) while they wait in an
// all_reduce that rank 2 joins only after they dumped. Young pending operations are in flight,
// not hung, and no dump says "timeout": healthy.
TEST(FlightRecorderFaultTest, DumpOfALiveJobIsHealthy) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job(
      "live", 3,
      [](int rank, ProcessGroup& world, const std::string&) {
        const fs::path dir = ::getenv("TESSEL_FR_DUMP_DIR");
        Tensor t = from_vector<float>({1.0f});
        for (int i = 0; i < 4; ++i) world.all_reduce(t);
        if (rank == 2) {
          testing::api_dump(dir, rank, "live dump");
          testing::wait_for_fr_dumps(dir, {0, 1}, rank);
          world.all_reduce(t);
          return;
        }
        std::thread dumper([&] {
          testing::wait_for_fr_dumps(dir, {2}, rank);  // rank 2 joins only after this dump
          testing::api_dump(dir, rank, "live dump");
        });
        world.all_reduce(t);
        dumper.join();
      },
      {}, /*api_dump=*/false);
  expect_all_exited(job);
  EXPECT_EQ(job.verdict.status, fr::VerdictStatus::kHealthy) << fr::format_verdict(job.verdict);
  EXPECT_TRUE(job.verdict.culprits.empty()) << fr::format_verdict(job.verdict);
  // The dumps of ranks 0 and 1 did catch all_reduce #5 pending.
  int pending = 0;
  for (const auto& d : job.dumps.dumps) {
    for (const auto& e : d.entries) {
      if (e.seq == 5 && !e.finished()) ++pending;
    }
  }
  EXPECT_EQ(pending, 2) << fr::format_verdict(job.verdict);
}

TEST(FlightRecorderFaultTest, HealthyJobIsHealthy) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_job("healthy", 4, [](int rank, ProcessGroup& world, const std::string&) {
    Tensor t = from_vector<float>({1.0f, static_cast<float>(rank)});
    for (int i = 0; i < 5; ++i) world.all_reduce(t);
    world.broadcast(t, {.root = 3});
    Tensor full = zeros({8});
    world.all_gather(t, full);
    world.barrier();
  });
  expect_all_exited(job);
  EXPECT_EQ(job.verdict.status, fr::VerdictStatus::kHealthy) << fr::format_verdict(job.verdict);
  EXPECT_TRUE(job.verdict.culprits.empty()) << fr::format_verdict(job.verdict);
  EXPECT_EQ(job.verdict.dumps, 4);
}

}  // namespace
}  // namespace tessel
