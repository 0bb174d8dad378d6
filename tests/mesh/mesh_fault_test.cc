// Hang diagnosis on DeviceMesh sub-groups: each test forks a real Gloo job (2 s collective
// timeouts), builds a mesh, runs a few training steps (FlightRecorder::set_step) with one fault
// injected, gathers every live rank's dump (through the store when a collective fails, by the
// API where the job ends) and asserts the verdict: the exact culprit set, that no rank that only
// waits is blamed, and the words of the verdict.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "tessel/collectives/gloo/gloo_backend.h"
#include "tessel/mesh/device_mesh.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/fr_fault_util.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kSteps = 4;

struct MeshJob {
  std::vector<testing::ProcessOutcome> outcomes;
  fr::Verdict verdict;
  std::string text;  // format_verdict(verdict)
};

struct MeshJobOptions {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::vector<int> dumpers = {};  // ranks whose dump every rank waits for (default: all)
  bool api_dump = false;          // every rank dumps at the end (jobs that do not hang)
  bool eager = true;              // make the mesh's groups at construction
};

using MeshBody = std::function<void(int rank, DeviceMesh& mesh, ProcessGroup& world)>;

int world_size_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return static_cast<int>(n);
}

// Runs `body` on every rank of a Gloo job shaped as the mesh. A collective error ends the rank's
// program (as an exception ends a training loop); the rank then stays alive until every rank in
// `dumpers` has dumped, so it answers dump requests.
MeshJob run_mesh_job(const std::string& name, const MeshJobOptions& o, const MeshBody& body) {
  const int world = world_size_of(o.shape);
  const std::vector<int> dumpers = o.dumpers.empty() ? testing::all_ranks(world) : o.dumpers;
  const fs::path dir = testing::fresh_fr_dir("mesh_" + name);
  MeshJob job;
  job.outcomes = testing::run_processes(
      world,
      [&](int rank, const std::string& store_dir) {
        ::signal(SIGPIPE, SIG_IGN);
        auto pg = testing::join_fr_world(rank, world, store_dir, dir);
        try {
          DeviceMesh mesh = init_device_mesh(pg, o.shape, o.names, {.eager = o.eager});
          body(rank, mesh, *pg);
        } catch (const Error& e) {
          std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        }
        if (o.api_dump) testing::api_dump(dir, rank, "end of job");
        testing::wait_for_fr_dumps(dir, dumpers, rank);
      },
      90s);
  job.verdict = testing::analyze_fr_dir(dir);
  job.text = fr::format_verdict(job.verdict);
  fs::remove_all(dir);
  return job;
}

// Exactly `culprits` blamed, one finding of `kind` naming them, no waiting rank among them, and
// every phrase of `words` in the verdict.
void expect_verdict(const MeshJob& job, const std::vector<int>& culprits, fr::FindingKind kind,
                    const std::vector<std::string>& words) {
  const fr::Verdict& v = job.verdict;
  EXPECT_EQ(v.status, fr::VerdictStatus::kCulpritFound) << job.text;
  EXPECT_EQ(v.culprits, culprits) << job.text;
  const bool found = std::any_of(v.findings.begin(), v.findings.end(), [&](const fr::Finding& f) {
    return f.kind == kind && f.culprits == culprits;
  });
  EXPECT_TRUE(found) << "no " << fr::finding_kind_name(kind) << " finding\n" << job.text;
  for (const auto& f : v.findings) {
    for (int w : f.waiting) {
      EXPECT_EQ(std::count(v.culprits.begin(), v.culprits.end(), w), 0)
          << "rank " << w << " only waits\n"
          << job.text;
    }
  }
  for (const auto& w : words)
    EXPECT_NE(job.text.find(w), std::string::npos) << w << "\n" << job.text;
}

#define TESSEL_REQUIRE_GLOO() \
  if (!gloo::is_available()) GTEST_SKIP() << "this build has no Gloo backend"

// One training step on the mesh: an all_reduce on each named dimension, in order; `skip` names
// a dimension this rank leaves out.
void step_all_reduces(DeviceMesh& mesh, const std::vector<std::string>& dims,
                      const std::string& skip = "") {
  for (const auto& dim : dims) {
    if (dim == skip) continue;
    Tensor t = from_vector<float>({1.0f, 2.0f, 3.0f, 4.0f});
    mesh.group(dim)->all_reduce(t);
  }
}

// A 2x2 (dp, tp) mesh; rank 1 skips its tp all_reduce in step 2. Its tp peer (rank 0) ends up
// waiting for it, and rank 0's dp peer (rank 2) for rank 0: only rank 1 deviated, and its step
// counts say so.
TEST(MeshFaultTest, TwoByTwoTpSkipBlamesOnlyTheSkipper) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job(
      "2x2_skip", {{2, 2}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          step_all_reduces(mesh, {"tp", "dp"}, rank == 1 && s == 2 ? "tp" : "");
        }
      });
  expect_verdict(job, {1}, fr::FindingKind::kNotJoined,
                 {"verdict: CULPRIT FOUND: rank 1\n",
                  "rank 1 issued 0 collectives on 'tp' in step 2, where 3 other members of 'tp' "
                  "groups issued at least 1: it skipped one there"});
}

// A 2x3 mesh: rank 4 skips a tp all_reduce of its three-rank group (split 2:1 against it).
TEST(MeshFaultTest, TwoByThreeTpSkipBlamesOnlyTheSkipper) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job(
      "2x3_skip", {{2, 3}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          step_all_reduces(mesh, {"tp", "dp"}, rank == 4 && s == 1 ? "tp" : "");
        }
      });
  expect_verdict(
      job, {4}, fr::FindingKind::kNotJoined,
      {"verdict: CULPRIT FOUND: rank 4\n", "rank 4 issued 0 collectives on 'tp' in step 1"});
}

// A 2x2x2 (dp, cp, tp) mesh: rank 5 skips its cp all_reduce in step 2.
TEST(MeshFaultTest, TwoByTwoByTwoSkipBlamesOnlyTheSkipper) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job(
      "2x2x2_skip", {{2, 2, 2}, {"dp", "cp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          step_all_reduces(mesh, {"tp", "cp", "dp"}, rank == 5 && s == 2 ? "cp" : "");
        }
      });
  expect_verdict(
      job, {5}, fr::FindingKind::kNotJoined,
      {"verdict: CULPRIT FOUND: rank 5\n", "rank 5 issued 0 collectives on 'cp' in step 2"});
}

// A flattened (dp, tp) dimension: rank 2 skips the all_reduce over dp_tp in step 1 and goes on
// to step 2's tp all_reduce, where its tp peer (waiting in dp_tp) never comes: a cycle, settled
// by the step counts.
TEST(MeshFaultTest, FlattenedDimSkipBlamesOnlyTheSkipper) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job("flat_skip", {{2, 2}, {"dp", "tp"}},
                                [](int rank, DeviceMesh& mesh, ProcessGroup&) {
                                  DeviceMesh flat = mesh.flatten({"dp", "tp"}, "dp_tp");
                                  for (int s = 0; s < kSteps; ++s) {
                                    fr::FlightRecorder::global().set_step(s);
                                    step_all_reduces(mesh, {"tp"});
                                    if (rank == 2 && s == 1) continue;
                                    Tensor t = from_vector<float>({1.0f});
                                    flat.group("dp_tp")->all_reduce(t);
                                  }
                                });
  expect_verdict(job, {2}, fr::FindingKind::kDeadlock,
                 {"verdict: CULPRIT FOUND: rank 2\n",
                  "rank 2 issued 0 collectives on 'dp_tp' in step 1, where 3 other members"});
}

// A ring of send/recv on the three-rank tp groups of a 2x3 mesh: rank 4 leaves out its send to
// rank 5 in step 1. Rank 5 ends up in a recv that rank 4 never matched.
TEST(MeshFaultTest, P2pRingOnASubGroupBlamesTheSenderThatSkipped) {
  TESSEL_REQUIRE_GLOO();
  const auto job =
      run_mesh_job("ring", {{2, 3}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        auto tp = mesh.group("tp");
        const int me = tp->rank(), next = (me + 1) % 3, prev = (me + 2) % 3;
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          Tensor out = from_vector<float>({static_cast<float>(rank)}), in = zeros({1});
          // Calls on one group run in issue order: even group ranks send first, odd ones
          // receive first, so the three-rank ring never waits on itself.
          const bool skip = rank == 4 && s == 1;
          if (me % 2 == 1) tp->recv(in, prev);
          if (!skip) tp->send(out, next);
          if (me % 2 == 0) tp->recv(in, prev);
        }
      });
  expect_verdict(job, {4}, fr::FindingKind::kUnmatchedRecv,
                 {"verdict: CULPRIT FOUND: rank 4\n",
                  "recv #4 at rank 5 from rank 4 in group 'tp' has no matching send: rank 4 never "
                  "posted it"});
}

// Async Work on one tp group issued in another order by one rank: rank 3 issues its all_gather
// before its all_reduce in step 1. Its group has two members (1:1), but the sibling tp group
// sides with rank 2.
TEST(MeshFaultTest, ReorderedAsyncWorkIsAMismatchOfTheReorderingRank) {
  TESSEL_REQUIRE_GLOO();
  const auto job =
      run_mesh_job("async", {{2, 2}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        auto tp = mesh.group("tp");
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          Tensor x = from_vector<float>({1.0f, 2.0f}), part = from_vector<float>({3.0f, 4.0f});
          Tensor full = zeros({4});
          std::vector<Work> works;
          auto reduce = [&] { works.push_back(tp->all_reduce(x, {.async = true})); };
          auto gather = [&] { works.push_back(tp->all_gather(part, full, {.async = true})); };
          if (rank == 3 && s == 1) {
            gather();
            reduce();
          } else {
            reduce();
            gather();
          }
          for (auto& w : works) w.wait();
        }
      });
  expect_verdict(job, {3}, fr::FindingKind::kMismatch,
                 {"verdict: CULPRIT FOUND: rank 3\n",
                  "rank 3 called all_gather where the others in 'tp' groups called all_reduce"});
}

// Rank 2 spins in its own code in step 2 while the others wait for it in tp and dp.
TEST(MeshFaultTest, RankSpinningInComputeIsNamed) {
  TESSEL_REQUIRE_GLOO();
  const fs::path dir = testing::fresh_fr_dir("mesh_spin_flag");
  const auto job =
      run_mesh_job("spin", {{2, 2}, {"dp", "tp"}}, [&](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          if (rank == 2 && s == 2) {
            // Busy until the others dumped (its own dump thread answers meanwhile).
            const fs::path dumps = ::getenv("TESSEL_FR_DUMP_DIR");
            const auto until = std::chrono::steady_clock::now() + 30s;
            volatile uint64_t x = 0;
            while (std::chrono::steady_clock::now() < until &&
                   !(testing::fr_dump_exists(dumps, 0) && testing::fr_dump_exists(dumps, 1) &&
                     testing::fr_dump_exists(dumps, 3))) {
              for (int i = 0; i < 100000; ++i) x = x + static_cast<uint64_t>(i);
            }
            return;
          }
          step_all_reduces(mesh, {"tp", "dp"});
        }
      });
  fs::remove_all(dir);
  expect_verdict(job, {2}, fr::FindingKind::kNotJoined,
                 {"verdict: CULPRIT FOUND: rank 2\n", "rank 2: in compute for",
                  "rank 2 is awaited in 2 operations of different groups"});
}

// Rank 3 crashes (SIGSEGV) in compute in step 2: its fatal-signal dump says so.
TEST(MeshFaultTest, CrashedRankIsNamedFromItsFatalSignalDump) {
  TESSEL_REQUIRE_GLOO();
  const auto job =
      run_mesh_job("crash", {{2, 2}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          if (rank == 3 && s == 2) ::raise(SIGSEGV);
          step_all_reduces(mesh, {"tp", "dp"});
        }
      });
  EXPECT_EQ(job.outcomes[3].signal, SIGSEGV) << testing::describe(job.outcomes[3]);
  expect_verdict(
      job, {3}, fr::FindingKind::kCrashed,
      {"verdict: CULPRIT FOUND: rank 3\n", "rank 3: crashed (SIGSEGV) in compute after"});
}

// Rank 1 leaves the job early with status 0 (no dump): the others wait for it in tp and dp.
TEST(MeshFaultTest, CleanEarlyExitIsNamed) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job("exit", {{2, 2}, {"dp", "tp"}, {0, 2, 3}},
                                [](int rank, DeviceMesh& mesh, ProcessGroup&) {
                                  for (int s = 0; s < kSteps; ++s) {
                                    fr::FlightRecorder::global().set_step(s);
                                    if (rank == 1 && s == 2) ::_exit(0);
                                    step_all_reduces(mesh, {"tp", "dp"});
                                  }
                                });
  EXPECT_TRUE(job.outcomes[1].exited && job.outcomes[1].exit_code == 0);
  expect_verdict(job, {1}, fr::FindingKind::kNotJoined,
                 {"verdict: CULPRIT FOUND: rank 1\n", "rank 1: no dump"});
}

// Rank 2 is slow (300 ms more per step) but well within the 2 s timeout: healthy, no blame; if
// anyone is reported as a straggler (information only), it is rank 2.
TEST(MeshFaultTest, SlowRankWithinTheTimeoutIsHealthy) {
  TESSEL_REQUIRE_GLOO();
  MeshJobOptions o{{2, 2}, {"dp", "tp"}};
  o.api_dump = true;
  const auto job = run_mesh_job("slow", o, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
    for (int s = 0; s < kSteps; ++s) {
      fr::FlightRecorder::global().set_step(s);
      if (rank == 2) std::this_thread::sleep_for(300ms);
      step_all_reduces(mesh, {"tp", "dp"});
    }
  });
  for (const auto& out : job.outcomes) EXPECT_TRUE(out.exited && out.exit_code == 0);
  EXPECT_EQ(job.verdict.status, fr::VerdictStatus::kHealthy) << job.text;
  EXPECT_TRUE(job.verdict.culprits.empty()) << job.text;
  for (const auto& s : job.verdict.stragglers) EXPECT_EQ(s.rank, 2) << job.text;
}

// Two ranks, no siblings: rank 1 skips the all_reduce of step 2 of 6 and goes on (the job
// shifts, and at the end rank 0 waits alone). Rank 1 broke its own rhythm of one all_reduce per
// step while rank 0 kept its: that settles the 1:1 wait.
TEST(MeshFaultTest, TwoRankSkipIsSettledByTheSkippersOwnRhythm) {
  TESSEL_REQUIRE_GLOO();
  const auto job =
      run_mesh_job("two_rank", {{2}, {"dp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < 6; ++s) {
          fr::FlightRecorder::global().set_step(s);
          step_all_reduces(mesh, {"dp"}, rank == 1 && s == 2 ? "dp" : "");
        }
      });
  expect_verdict(job, {1}, fr::FindingKind::kNotJoined,
                 {"verdict: CULPRIT FOUND: rank 1\n",
                  "rank 1 issued 0 collectives on 'dp' in step 2, where it issued 1 in each of its "
                  "4 other finished steps"});
}

// Two faults at once in a 2x4 mesh: rank 1 skips a tp all_reduce in step 1 and rank 6 a dp
// all_reduce in step 2. Both are named, and nobody else.
TEST(MeshFaultTest, TwoSkipsInDifferentDimensionsNameBothRanks) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job(
      "two_skips", {{2, 4}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          const std::string skip = rank == 1 && s == 1 ? "tp" : rank == 6 && s == 2 ? "dp" : "";
          step_all_reduces(mesh, {"tp", "dp"}, skip);
        }
      });
  const fr::Verdict& v = job.verdict;
  EXPECT_EQ(v.status, fr::VerdictStatus::kCulpritFound) << job.text;
  EXPECT_EQ(v.culprits, (std::vector<int>{1, 6})) << job.text;
}

// Both tp groups of a 2x2 mesh lose a member's all_reduce in the same step (ranks 1 and 3): an
// even split, no majority; each skipper broke its own rhythm while its peer kept its own.
TEST(MeshFaultTest, SkipsInBothSiblingGroupsNameBothSkippers) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job(
      "both_tp", {{2, 2}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < 6; ++s) {
          fr::FlightRecorder::global().set_step(s);
          step_all_reduces(mesh, {"tp", "dp"}, (rank == 1 || rank == 3) && s == 2 ? "tp" : "");
        }
      });
  const fr::Verdict& v = job.verdict;
  EXPECT_EQ(v.status, fr::VerdictStatus::kCulpritFound) << job.text;
  EXPECT_EQ(v.culprits, (std::vector<int>{1, 3})) << job.text;
}

// A 2x2 mesh where rank 3 is SIGKILLed in step 2: no dump; its tp and dp peers wait for it.
TEST(MeshFaultTest, KilledRankIsTheOnlyCulprit) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job("kill", {{2, 2}, {"dp", "tp"}, {0, 1, 2}},
                                [](int rank, DeviceMesh& mesh, ProcessGroup&) {
                                  for (int s = 0; s < kSteps; ++s) {
                                    fr::FlightRecorder::global().set_step(s);
                                    if (rank == 3 && s == 2) ::raise(SIGKILL);
                                    step_all_reduces(mesh, {"tp", "dp"});
                                  }
                                });
  EXPECT_EQ(job.outcomes[3].signal, SIGKILL) << testing::describe(job.outcomes[3]);
  expect_verdict(job, {3}, fr::FindingKind::kNotJoined,
                 {"verdict: CULPRIT FOUND: rank 3\n", "rank 3: no dump"});
}

// A size mismatch in a two-rank dp group of a 2x2 mesh (1:1 inside the group): the sibling dp
// group passes what rank 0 passes, so rank 2 is the one that disagrees.
TEST(MeshFaultTest, MismatchInATwoRankGroupIsSettledBySiblings) {
  TESSEL_REQUIRE_GLOO();
  const auto job = run_mesh_job("dp_size", {{2, 2}, {"dp", "tp"}},
                                [](int rank, DeviceMesh& mesh, ProcessGroup&) {
                                  for (int s = 0; s < kSteps; ++s) {
                                    fr::FlightRecorder::global().set_step(s);
                                    Tensor t = zeros({rank == 2 && s == 1 ? 8 : 4});
                                    mesh.group("dp")->all_reduce(t);
                                  }
                                });
  expect_verdict(job, {2}, fr::FindingKind::kMismatch,
                 {"verdict: CULPRIT FOUND: rank 2\n",
                  "rank 2 passed 8 input / 8 output elements where the others in 'dp' groups "
                  "passed 4 / 4"});
}

// A 2x4 mesh: rank 6 issues one tp all_reduce more than the others at the end of the job.
TEST(MeshFaultTest, ExtraCollectiveOnASubGroupIsNamed) {
  TESSEL_REQUIRE_GLOO();
  const auto job =
      run_mesh_job("extra", {{2, 4}, {"dp", "tp"}}, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
        for (int s = 0; s < kSteps; ++s) {
          fr::FlightRecorder::global().set_step(s);
          step_all_reduces(mesh, {"tp", "dp"});
        }
        if (rank == 6) step_all_reduces(mesh, {"tp"});
      });
  expect_verdict(job, {6}, fr::FindingKind::kExtraCollective,
                 {"verdict: CULPRIT FOUND: rank 6\n", "rank 6 issued all_reduce #5 of group 'tp'"});
}

// Mesh groups created in different orders: rank 4 asks for dp before tp, the other five for tp
// before dp. The world's split #1 is a mismatch in the name of the group made.
TEST(MeshFaultTest, GroupCreationInAnotherOrderIsAMismatch) {
  TESSEL_REQUIRE_GLOO();
  MeshJobOptions o{{2, 3}, {"dp", "tp"}};
  o.eager = false;
  const auto job = run_mesh_job("create_order", o, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
    if (rank == 4) {
      mesh.group("dp");
      mesh.group("tp");
    } else {
      mesh.group("tp");
      mesh.group("dp");
    }
    step_all_reduces(mesh, {"tp", "dp"});
  });
  expect_verdict(job, {4}, fr::FindingKind::kMismatch,
                 {"verdict: CULPRIT FOUND: rank 4\n", "split #1 of group 'world'",
                  "rank 4 created group 'dp' where the others created 'tp'"});
}

// Half the ranks create tp first, half dp first: nothing tells which order was meant.
TEST(MeshFaultTest, GroupCreationSplitEvenlyIsSaidToBeSymmetric) {
  TESSEL_REQUIRE_GLOO();
  MeshJobOptions o{{2, 2}, {"dp", "tp"}};
  o.eager = false;
  const auto job = run_mesh_job("create_even", o, [](int rank, DeviceMesh& mesh, ProcessGroup&) {
    const bool dp_first = rank >= 2;
    mesh.group(dp_first ? "dp" : "tp");
    mesh.group(dp_first ? "tp" : "dp");
  });
  EXPECT_EQ(job.verdict.status, fr::VerdictStatus::kInconclusive) << job.text;
  EXPECT_TRUE(job.verdict.culprits.empty()) << job.text;
  EXPECT_EQ(job.verdict.suspects, (std::vector<int>{0, 1, 2, 3})) << job.text;
  for (const char* words : {"differ with no majority to tell which side deviated",
                            "ranks 0,1 created group 'tp' where ranks 2,3 created 'dp'"}) {
    EXPECT_NE(job.text.find(words), std::string::npos) << words << "\n" << job.text;
  }
}

}  // namespace
}  // namespace tessel
