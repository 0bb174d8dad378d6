// The threads backend: every collective x world sizes 1, 2, 3, 4, 8 x dtypes x counts, checked
// against locally computed expectations; split, send/recv, async Work, timeouts and aborts.

#include "tessel/collectives/threads/threads_backend.h"

#include <gtest/gtest.h>

#include <atomic>

#include "collective_checks.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/recorder.h"
#include "tessel/tensor/ops.h"

namespace tessel {
namespace {

class ThreadsBackendSweepTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadsBackendSweepTest, EveryCollectiveMatchesLocalExpectation) {
  const int size = GetParam();
  threads::run_ranks(size, [&](ProcessGroup& pg) {
    testing::check_everything(pg, testing::acceptance_counts(/*large=*/false));
  });
}

TEST_P(ThreadsBackendSweepTest, OneMillionElements) {
  const int size = GetParam();
  threads::run_ranks(size, [&](ProcessGroup& pg) { testing::check_one_million(pg); });
}

TEST_P(ThreadsBackendSweepTest, SplitsIntoOddColours) {
  const int size = GetParam();
  threads::run_ranks(size, [&](ProcessGroup& pg) {
    testing::check_split(pg, 3, /*with_no_color=*/false);
    testing::check_split(pg, 1, /*with_no_color=*/size > 1);
    testing::check_split(pg, 2, /*with_no_color=*/false);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadsBackendSweepTest, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "World" + std::to_string(info.param); });

TEST(ThreadsBackendTest, AsyncWorkCompletesInIssueOrder) {
  threads::run_ranks(3, [](ProcessGroup& pg) {
    std::vector<Tensor> tensors;
    std::vector<Work> works;
    for (int i = 0; i < 20; ++i) {
      tensors.push_back(from_vector<float>({static_cast<float>(i + pg.rank())}));
      works.push_back(pg.all_reduce(tensors.back(), {.async = true}));
    }
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(works[i].wait(std::chrono::seconds(30)));
      EXPECT_TRUE(works[i].is_completed());
      EXPECT_EQ(tensors[i].data<float>()[0], static_cast<float>(3 * i + 3));
    }
    EXPECT_EQ(pg.seq(), 20u);
  });
}

TEST(ThreadsBackendTest, RecordsEveryCallInTheFlightRecorder) {
  auto& recorder = fr::FlightRecorder::global();
  const uint64_t before = recorder.recorded();
  threads::run_ranks(
      2,
      [](ProcessGroup& pg) {
        Tensor t = from_vector<float>({1, 2, 3});
        pg.all_reduce(t, {.op = ReduceOp::kMax});
        pg.broadcast(t, {.root = 1});
      },
      ProcessGroupOptions{.name = "fr-check", .id = 4242});
  EXPECT_EQ(recorder.recorded() - before, 4u);
  int all_reduce = 0, broadcast = 0;
  for (const auto& e : recorder.snapshot()) {
    if (e.group_id != 4242) continue;
    EXPECT_EQ(e.state, fr::EntryState::kCompleted);
    EXPECT_EQ(e.input.numel, 3);
    if (e.op == fr::OpType::kAllReduce) {
      ++all_reduce;
      EXPECT_EQ(e.seq, 1u);
      EXPECT_EQ(e.reduce_op, ReduceOp::kMax);
    } else if (e.op == fr::OpType::kBroadcast) {
      ++broadcast;
      EXPECT_EQ(e.seq, 2u);
      EXPECT_EQ(e.root, 1);
    }
  }
  EXPECT_EQ(all_reduce, 2);
  EXPECT_EQ(broadcast, 2);
  bool registered = false;
  for (const auto& g : recorder.groups()) registered |= g.id == 4242 && g.name == "fr-check";
  EXPECT_TRUE(registered);
}

TEST(ThreadsBackendTest, RecordsPointToPointWithPeerAndP2pSeq) {
  threads::run_ranks(
      2,
      [](ProcessGroup& pg) {
        Tensor t = from_vector<int64_t>({1, 2});
        for (int i = 0; i < 2; ++i) {
          if (pg.rank() == 0) {
            pg.send(t, 1, {.tag = 3});
          } else {
            pg.recv(t, 0, {.tag = 3});
          }
        }
      },
      ProcessGroupOptions{.name = "p2p", .id = 4343});
  std::vector<uint64_t> send_seqs, recv_seqs;
  for (const auto& e : fr::FlightRecorder::global().snapshot()) {
    if (e.group_id != 4343) continue;
    EXPECT_EQ(e.state, fr::EntryState::kCompleted);
    EXPECT_EQ(e.seq, 0u);  // point to point does not take a collective sequence number
    if (e.op == fr::OpType::kSend) {
      EXPECT_EQ(e.peer, 1);
      send_seqs.push_back(e.p2p_seq);
    } else if (e.op == fr::OpType::kRecv) {
      EXPECT_EQ(e.peer, 0);
      EXPECT_EQ(e.output.numel, 2);
      recv_seqs.push_back(e.p2p_seq);
    }
  }
  EXPECT_EQ(send_seqs, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(recv_seqs, (std::vector<uint64_t>{1, 2}));
}

TEST(ThreadsBackendTest, MissingRankTimesOutNamingGroupSeqAndRank) {
  auto groups = threads::create_world(3, {.name = "tp", .id = 9});
  std::atomic<int> timeouts{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    ranks.emplace_back([&, r] {
      Tensor t = from_vector<float>({1});
      try {
        groups[r]->all_reduce(t, {.timeout = std::chrono::milliseconds(300)});
      } catch (const Timeout& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("'tp'"), std::string::npos) << what;
        EXPECT_NE(what.find("#1 on group"), std::string::npos) << what;
        EXPECT_NE(what.find("not arrived: world rank 2 (group rank 2)"), std::string::npos) << what;
        ++timeouts;
      } catch (const CommError&) {
        ++timeouts;  // the second waiter may see the group already broken by the first
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(timeouts.load(), 2);
  int failed = 0;
  for (const auto& e : fr::FlightRecorder::global().snapshot()) {
    if (e.group_id == 9 && e.op == fr::OpType::kAllReduce) {
      EXPECT_EQ(e.state, fr::EntryState::kFailed);
      ++failed;
    }
  }
  EXPECT_EQ(failed, 2);
}

TEST(ThreadsBackendTest, WaitRethrowsTheStoredError) {
  auto groups = threads::create_world(2);
  Tensor t = from_vector<float>({1});
  Work w = groups[0]->all_reduce(t, {.timeout = std::chrono::milliseconds(100), .async = true});
  EXPECT_THROW(w.wait(std::chrono::seconds(30)), Timeout);
  EXPECT_TRUE(w.is_completed());
  EXPECT_FALSE(w.is_success());
}

// After a call timed out, what is still queued on the group fails at once instead of each call
// waiting out its own timeout against the same lost peer (a background thread's queue of async
// calls, a destructor joining it): whether the backend knows itself broken (threads, Gloo) or
// the group is dropped (ProcessGroup fails queued calls unrun after a transport failure).
TEST(ThreadsBackendTest, DestroyingAFailedGroupFailsItsQueuedCallsUnrun) {
  auto groups = threads::create_world(2, {.name = "queued", .id = 11});
  std::vector<Tensor> tensors(6, from_vector<float>({1}));
  std::vector<Work> works;
  for (auto& t : tensors) {  // rank 1 never calls
    works.push_back(
        groups[0]->all_reduce(t, {.timeout = std::chrono::milliseconds(200), .async = true}));
  }
  EXPECT_THROW(works[0].wait(std::chrono::seconds(30)), Timeout);
  groups[0].reset();  // the destructor drains the queue
  for (size_t i = 1; i < works.size(); ++i) {
    try {
      works[i].wait(std::chrono::seconds(30));
      ADD_FAILURE() << "call " << i << " succeeded without its peer";
    } catch (const Timeout& e) {
      ADD_FAILURE() << "call " << i << " waited out its own timeout: " << e.what();
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("not run: its group was destroyed") != std::string::npos ||
                  what.find("unusable") != std::string::npos)
          << "call " << i << ": " << what;
    }
  }
}

TEST(ThreadsBackendTest, RejectsMismatchedSizesWithClearMessages) {
  auto groups = threads::create_world(2);
  Tensor in = zeros({3});
  Tensor out = zeros({5});
  try {
    groups[0]->all_gather(in, out);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("expected 6"), std::string::npos) << e.what();
  }
  Tensor t = zeros({4});
  EXPECT_THROW(groups[0]->broadcast(t, {.root = 2}), InvalidArgument);
  EXPECT_THROW(groups[0]->send(t, 0), InvalidArgument);
}

// The list form of all_to_all takes views; it is one recorded collective with the group's next
// seq, its totals as shapes, and bad lists fail on the caller with the bad value named.
TEST(ThreadsBackendTest, AllToAllOverViewsIsRecordedAndChecked) {
  threads::run_ranks(
      2,
      [](ProcessGroup& pg) {
        Tensor in = zeros({3, 4}), out = zeros({3, 4});
        pg.barrier();
        pg.all_to_all({narrow(in, 1, 0, 2), narrow(in, 1, 2, 2)},
                      {narrow(out, 1, 0, 2), narrow(out, 1, 2, 2)});
      },
      ProcessGroupOptions{.name = "views", .id = 4444});
  int seen = 0;
  for (const auto& e : fr::FlightRecorder::global().snapshot()) {
    if (e.group_id != 4444 || e.op != fr::OpType::kAllToAll) continue;
    ++seen;
    EXPECT_EQ(e.seq, 2u);
    EXPECT_EQ(e.state, fr::EntryState::kCompleted);
    EXPECT_EQ(e.input.numel, 12);
    EXPECT_EQ(e.output.numel, 12);
  }
  EXPECT_EQ(seen, 2);

  auto groups = threads::create_world(2);
  ProcessGroup& pg = *groups[0];
  Tensor a = zeros({4}), b = zeros({4}), c = zeros({5}), i = zeros({4}, DType::kI64);
  auto expect_message = [](const std::function<void()>& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "expected InvalidArgument saying " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_message(
      [&] {
        pg.all_to_all(std::vector<Tensor>{a}, {a, b});
      },
      "1 inputs and 2 outputs given");
  expect_message([&] { pg.all_to_all({a, b}, {a, i}); }, "output 1 is i64");
  expect_message([&] { pg.all_to_all({a, b}, {c, b}); }, "sends itself 4 elements but receives 5");
  expect_message([&] { pg.all_to_all({a, b}, {a, b}, {.send_counts = {4, 4}}); }, "must be empty");
}

TEST(ThreadsBackendTest, RunRanksPropagatesTheFirstFailure) {
  EXPECT_THROW(threads::run_ranks(3,
                                  [](ProcessGroup& pg) {
                                    if (pg.rank() == 1) throw InvalidArgument("boom");
                                    pg.barrier({.timeout = std::chrono::seconds(20)});
                                  }),
               Error);
}

TEST(ThreadsBackendTest, FailureWakesRanksBlockedInSubGroups) {
  // With the default 5-minute timeout, only the abort of every group of the world lets this
  // finish within the ctest timeout.
  EXPECT_THROW(threads::run_ranks(4,
                                  [](ProcessGroup& pg) {
                                    auto sub = pg.split(pg.rank() % 2, pg.rank());
                                    if (pg.rank() == 3) throw InvalidArgument("rank 3 gives up");
                                    sub->barrier();
                                  }),
               InvalidArgument);
}

}  // namespace
}  // namespace tessel
