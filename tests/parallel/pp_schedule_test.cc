// Pipeline schedules as data: the text form, the built-in generators, the validator and the
// timing model. Expected figures come from the schedules' theory: 1F1B idles (p−1)/(m+p−1),
// interleaved 1F1B (p−1)/(v·m+p−1), ZB-H1 (p−1)(F+B−W) per rank, GPipe holds m activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tessel/base/error.h"
#include "tessel/collectives/fake/fake_backend.h"
#include "tessel/parallel/pp/schedule.h"
#include "tessel/parallel/pp/schedule_generate.h"
#include "tessel/parallel/pp/schedule_simulate.h"
#include "tessel/parallel/pp/schedule_validate.h"
#include "tessel/tensor/tensor.h"

namespace tessel::pp {
namespace {

using namespace std::chrono_literals;

// The message validate_schedule throws; "" if it passes.
std::string validation_error(const PipelineSchedule& s) {
  try {
    validate_schedule(s);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

std::string parse_error(const std::string& text) {
  try {
    parse_schedule(text);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

// Equal F, B and W (1 ms each), free links.
constexpr ScheduleCosts kUnitCosts{.forward = 1ms, .backward_input = 1ms, .backward_weight = 1ms};

// ---- text form ----

TEST(PipelineScheduleTextTest, ParsesEveryKindOfToken) {
  const auto actions =
      parse_actions("F3s1 B3s1 W3s1 BW3s1 SEND_F3s1>2 RECV_F3s2<1 SEND_B3s2>1 RECV_B3s1<2 STEP");
  const std::vector<Action> expected = {
      {ActionKind::kForward, 3, 1, -1},        {ActionKind::kBackwardInput, 3, 1, -1},
      {ActionKind::kBackwardWeight, 3, 1, -1}, {ActionKind::kBackward, 3, 1, -1},
      {ActionKind::kSendActivation, 3, 1, 2},  {ActionKind::kRecvActivation, 3, 2, 1},
      {ActionKind::kSendGradient, 3, 2, 1},    {ActionKind::kRecvGradient, 3, 1, 2},
      {ActionKind::kStep, -1, -1, -1}};
  EXPECT_EQ(actions, expected);
  EXPECT_EQ(format_actions(actions),
            "F3s1 B3s1 W3s1 BW3s1 SEND_F3s1>2 RECV_F3s2<1 SEND_B3s2>1 RECV_B3s1<2 STEP");
  EXPECT_EQ(to_string(parse_action("SEND_B12s10>9")), "SEND_B12s10>9");
}

TEST(PipelineScheduleTextTest, MalformedTokenNamesTokenAndPosition) {
  for (const auto& [text, token, position] : std::vector<std::tuple<std::string, std::string, int>>{
           {"F0s0 F1x0", "F1x0", 2},
           {"F0s0 F1s0 SEND_F1s0<1", "SEND_F1s0<1", 3},
           {"F3s", "F3s", 1},
           {"F0s0 BW1s0 Q", "Q", 3},
           {"F-1s0", "F-1s0", 1},
           {"RECV_B0s0", "RECV_B0s0", 1},
           {"F0s0 step", "step", 2},
           {"F0s0 F1s0 F2s0s", "F2s0s", 3}}) {
    try {
      parse_actions(text);
      ADD_FAILURE() << "parsed '" << text << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find("token " + std::to_string(position) + " '" + token + "'"),
                std::string::npos)
          << e.message();
      EXPECT_NE(e.message().find("expected"), std::string::npos) << e.message();
    }
  }
}

TEST(PipelineScheduleTextTest, EveryBuiltInScheduleRoundTrips) {
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}) {
    const auto s = make_schedule(name, 3, 6);
    const auto back = parse_schedule("# a comment line\n" + format_schedule(s));
    EXPECT_EQ(back.num_ranks, s.num_ranks) << name;
    EXPECT_EQ(back.num_stages, s.num_stages) << name;
    EXPECT_EQ(back.num_microbatches, s.num_microbatches) << name;
    EXPECT_EQ(back.ranks, s.ranks) << name;
  }
}

TEST(PipelineScheduleTextTest, ParsesTheDocumentedExample) {
  const auto s = parse_schedule(
      "pipeline ranks=2 stages=2 microbatches=2\n"
      "0: F0s0 SEND_F0s0>1 F1s0 SEND_F1s0>1 RECV_B0s0<1 BW0s0 RECV_B1s0<1 BW1s0 STEP\n"
      "1: RECV_F0s1<0 F0s1 BW0s1 SEND_B0s1>0 RECV_F1s1<0 F1s1 BW1s1 SEND_B1s1>0 STEP  # last\n");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.ranks[1][3], (Action{ActionKind::kSendGradient, 0, 1, 0}));
  EXPECT_EQ(validate_schedule(s).peak_in_flight, (std::vector<int>{2, 1}));
}

TEST(PipelineScheduleTextTest, MalformedScheduleNamesLineAndToken) {
  EXPECT_NE(parse_error("0: F0s0\n").find("line 1 '0: F0s0' is not a header"), std::string::npos);
  EXPECT_NE(parse_error("pipeline ranks=1 stages=1 microbatches=1\n0: F0s0 BW0s0 X9\n")
                .find("line 2 (rank 0), token 3 'X9' is malformed"),
            std::string::npos);
  EXPECT_NE(parse_error("pipeline ranks=2 stages=2 microbatches=1\n1: F0s1\n")
                .find("line 2 is for rank 1; expected rank 0"),
            std::string::npos);
  EXPECT_NE(parse_error("pipeline ranks=2 stages=2 microbatches=1\n0: F0s0\n")
                .find("ranks=2 but 1 rank lines"),
            std::string::npos);
  EXPECT_NE(parse_error("").find("empty"), std::string::npos);
}

// ---- generators ----

std::vector<Action> compute_of(const PipelineSchedule& s, int rank) {
  std::vector<Action> out;
  for (const Action& a : s.ranks[rank]) {
    if (is_compute(a.kind)) out.push_back(a);
  }
  return out;
}

TEST(PipelineScheduleGenerateTest, OneFOneBOrderFollowsItsDefinition) {
  // p = 2, m = 3: rank 0 warms up with p−1 = 1 forward, rank 1 with none.
  const auto s = make_1f1b(2, 3);
  EXPECT_EQ(format_actions(compute_of(s, 0)), "F0s0 F1s0 BW0s0 F2s0 BW1s0 BW2s0");
  EXPECT_EQ(format_actions(compute_of(s, 1)), "F0s1 BW0s1 F1s1 BW1s1 F2s1 BW2s1");
  EXPECT_EQ(format_actions(s.ranks[1]),
            "RECV_F0s1<0 F0s1 BW0s1 SEND_B0s1>0 RECV_F1s1<0 F1s1 BW1s1 SEND_B1s1>0 "
            "RECV_F2s1<0 F2s1 BW2s1 SEND_B2s1>0 STEP");
}

TEST(PipelineScheduleGenerateTest, InterleavedPlacesStagesInALoop) {
  // p = 2, v = 2: stages 0 and 2 on rank 0, 1 and 3 on rank 1; micro-batches in groups of 2.
  const auto s = make_interleaved_1f1b(2, 2, 2);
  EXPECT_EQ(s.num_stages, 4);
  EXPECT_EQ(format_actions(compute_of(s, 0)), "F0s0 F1s0 F0s2 F1s2 BW0s2 BW1s2 BW0s0 BW1s0");
}

TEST(PipelineScheduleGenerateTest, ZeroBubbleSplitsBackwardAndDefersWeights) {
  const auto s = make_zero_bubble_h1(3, 3);
  // The last rank (r = 2) lets 2 W's wait; rank 0 runs each W right after its B.
  EXPECT_EQ(format_actions(compute_of(s, 2)), "F0s2 B0s2 F1s2 B1s2 F2s2 B2s2 W0s2 W1s2 W2s2");
  EXPECT_EQ(format_actions(compute_of(s, 0)), "F0s0 F1s0 F2s0 B0s0 W0s0 B1s0 W1s0 B2s0 W2s0");
}

TEST(PipelineScheduleGenerateTest, ClearErrorsForSizesASchedulesCannotTake) {
  auto error = [](auto make) -> std::string {
    try {
      make();
    } catch (const InvalidArgument& e) {
      return e.message();
    }
    return "";
  };
  EXPECT_NE(error([] { make_1f1b(4, 3); }).find("3 micro-batches for 4 ranks"), std::string::npos);
  EXPECT_NE(error([] { make_zero_bubble_h1(4, 2); }).find("m >= p"), std::string::npos);
  EXPECT_NE(error([] { make_interleaved_1f1b(4, 6, 2); }).find("multiple of the rank count"),
            std::string::npos);
  EXPECT_NE(error([] { make_interleaved_1f1b(4, 8, 0); }).find("0 virtual stages"),
            std::string::npos);
  EXPECT_NE(error([] { make_gpipe(0, 8); }).find("0 ranks"), std::string::npos);
  EXPECT_NE(error([] { make_gpipe(2, 0); }).find("0 micro-batches"), std::string::npos);
  EXPECT_NE(error([] { make_schedule("2f2b", 2, 2); }).find("'2f2b' is unknown"),
            std::string::npos);
  EXPECT_NO_THROW(make_gpipe(4, 1));  // GPipe takes any m
}

// Every built-in schedule passes the validator over rank counts 1..8 (odd ones included) and
// micro-batch counts from p up.
TEST(PipelineScheduleGenerateTest, BuiltInSchedulesValidate) {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int m : {p, p + 1, 2 * p, 3 * p + 1}) {
      for (const char* name : {"gpipe", "1f1b", "zero-bubble"}) {
        EXPECT_EQ(validation_error(make_schedule(name, p, m)), "")
            << name << " p=" << p << " m=" << m;
      }
      for (int v : {1, 2, 3}) {
        if (m % p != 0) continue;
        EXPECT_EQ(validation_error(make_interleaved_1f1b(p, m, v)), "")
            << "interleaved p=" << p << " m=" << m << " v=" << v;
      }
    }
  }
}

// ---- validator ----

PipelineSchedule one_f_one_b_2x2() { return make_1f1b(2, 2); }

TEST(PipelineScheduleValidateTest, MissingReceiveNamesTheSend) {
  auto s = one_f_one_b_2x2();
  ASSERT_EQ(to_string(s.ranks[1][0]), "RECV_F0s1<0");
  s.ranks[1].erase(s.ranks[1].begin());
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '1f1b': rank 0, action 2 'SEND_F0s0>1': rank 1 never receives it "
            "(no RECV_F0s1<0)");
}

TEST(PipelineScheduleValidateTest, ReceivesOutOfSendOrder) {
  // Rank 1 receives micro-batch 1's activation before micro-batch 0's.
  const auto s = parse_schedule(
      "pipeline ranks=2 stages=2 microbatches=2\n"
      "0: F0s0 SEND_F0s0>1 F1s0 SEND_F1s0>1 RECV_B0s0<1 BW0s0 RECV_B1s0<1 BW1s0 STEP\n"
      "1: RECV_F1s1<0 RECV_F0s1<0 F0s1 BW0s1 SEND_B0s1>0 F1s1 BW1s1 SEND_B1s1>0 STEP\n");
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '': rank 1, action 1 'RECV_F1s1<0': is receive #1 from rank 0, "
            "but rank 0's send #1 to rank 1 is SEND_F0s0>1; receives from a peer must come in the "
            "order it sends");
}

TEST(PipelineScheduleValidateTest, DataFlowViolations) {
  // A backward before its forward.
  auto s = parse_schedule(
      "pipeline ranks=1 stages=1 microbatches=1\n"
      "0: BW0s0 F0s0 STEP\n");
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '': rank 0, action 1 'BW0s0': runs before its forward F0s0 "
            "(action 2)");
  // A W before its B.
  s = parse_schedule("pipeline ranks=1 stages=1 microbatches=1\n0: F0s0 W0s0 B0s0\n");
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '': rank 0, action 2 'W0s0': runs before its backward-input B0s0 "
            "(action 3)");
  // Two stages on one rank: stage 1's forward before stage 0's.
  s = parse_schedule("pipeline ranks=1 stages=2 microbatches=1\n0: F0s1 F0s0 BW0s1 BW0s0\n");
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '': rank 0, action 1 'F0s1': runs before F0s0, whose output it "
            "consumes (action 2)");
  // Backward of stage 0 before that of stage 1 on the same rank (gradients flow in reverse).
  s = parse_schedule("pipeline ranks=1 stages=2 microbatches=1\n0: F0s0 F0s1 BW0s0 BW0s1\n");
  EXPECT_NE(validation_error(s).find("rank 0, action 3 'BW0s0': runs before the backward of "
                                     "stage 1"),
            std::string::npos);
}

TEST(PipelineScheduleValidateTest, StructuralErrors) {
  auto s = one_f_one_b_2x2();
  s.ranks[0].push_back(forward(1, 0));  // after STEP, and a duplicate
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '1f1b': rank 0, action 10 'F1s0': comes after STEP (action 9); "
            "the optimizer step must follow all of the rank's work");
  s = one_f_one_b_2x2();
  s.ranks[0].insert(s.ranks[0].begin(), forward(1, 0));
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '1f1b': rank 0, action 4 'F1s0': appears twice (also action 1)");
  s = one_f_one_b_2x2();
  s.ranks[0].insert(s.ranks[0].begin(), forward(0, 1));
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '1f1b': rank 0, action 1 'F0s1': stage 1 runs on rank 1 "
            "(stage % 2), not on rank 0");
  s = one_f_one_b_2x2();
  s.ranks[0][1].peer = 0;  // SEND_F0s0>0
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '1f1b': rank 0, action 2 'SEND_F0s0>0': peer rank 0; the "
            "neighbouring stage runs on rank 1");
  // Two stages on one rank exchange nothing.
  s = parse_schedule("pipeline ranks=1 stages=2 microbatches=1\n0: F0s0 SEND_F0s0>0\n");
  EXPECT_EQ(validation_error(s),
            "pipeline schedule '': rank 0, action 2 'SEND_F0s0>0': the neighbouring stage is on "
            "this rank; the tensor stays local and needs no send");
  s = one_f_one_b_2x2();
  s.ranks[1].erase(s.ranks[1].begin() + 1);  // F0s1
  EXPECT_EQ(validation_error(s), "pipeline schedule '1f1b': rank 1: F0s1 is missing");
  // A header promising more work than the lists hold fails before anything is sized by it.
  EXPECT_EQ(validation_error(parse_schedule(
                "pipeline ranks=1 stages=1000000 microbatches=999999999\n0: F0s0 BW0s0\n")),
            "pipeline schedule '': 999999999 micro-batches on 1000000 stages need at least "
            "1999999998000000 actions (an F and a backward each); the ranks' lists have 2");
  s = one_f_one_b_2x2();
  s.ranks[0][0].microbatch = 7;
  EXPECT_NE(validation_error(s).find("micro-batch 7 is out of range; expected 0..1"),
            std::string::npos);
}

TEST(PipelineScheduleValidateTest, DeadlockNamesEveryBlockedRank) {
  // Rank 0 waits for the gradient before it sends the activation that produces it.
  const std::string text =
      "pipeline ranks=2 stages=2 microbatches=1\n"
      "0: F0s0 RECV_B0s0<1 SEND_F0s0>1 BW0s0 STEP\n"
      "1: RECV_F0s1<0 F0s1 BW0s1 SEND_B0s1>0 STEP\n";
  const std::string expected =
      "pipeline schedule '': deadlock (sends asynchronous, receives blocking): rank 0 waits at "
      "action 2 'RECV_B0s0<1' for rank 1, which waits at action 1 'RECV_F0s1<0'; rank 1 waits at "
      "action 1 'RECV_F0s1<0' for rank 0, which waits at action 2 'RECV_B0s0<1'";
  // Pure data: every rank, parsing the same text, reaches the same message.
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(validation_error(parse_schedule(text)), expected);
}

TEST(PipelineScheduleValidateTest, PeakActivationsFollowTheSchedule) {
  for (int p : {1, 2, 3, 4, 8}) {
    const int m = 2 * p + 1;
    // GPipe: every forward before any backward, so every stage holds all m.
    EXPECT_EQ(validate_schedule(make_gpipe(p, m)).peak_in_flight, std::vector<int>(p, m));
    // 1F1B: rank r holds its p−1−r warm-up forwards plus one, stage 0 holds p.
    const auto one = validate_schedule(make_1f1b(p, m)).peak_in_flight;
    for (int r = 0; r < p; ++r) EXPECT_EQ(one[r], p - r) << "p=" << p << " rank " << r;
    EXPECT_LE(one[0], p);
    // ZB-H1: the deferred W's keep activations alive, up to p on every rank.
    EXPECT_EQ(validate_schedule(make_zero_bubble_h1(p, m)).peak_in_flight, std::vector<int>(p, p));
    // Interleaved (Megatron-LM): rank r warms up with 2(p−1−r) + (v−1)p forwards, then one more.
    for (int v : {2, 3}) {
      const auto inter = validate_schedule(make_interleaved_1f1b(p, 4 * p, v)).peak_in_flight;
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(inter[r], std::min(4 * p * v, 2 * (p - 1 - r) + (v - 1) * p + 1))
            << "p=" << p << " v=" << v << " rank " << r;
      }
    }
  }
}

// ---- timing model ----

TEST(PipelineScheduleSimulateTest, OneFOneBBubbleMatchesTheory) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p + 1}) {
      const double theory = static_cast<double>(p - 1) / (m + p - 1);
      const auto t = simulate_schedule(make_1f1b(p, m), kUnitCosts);
      for (int r = 0; r < p; ++r) {
        EXPECT_NEAR(t.idle_fraction[r], theory, 1e-9) << "p=" << p << " m=" << m << " r=" << r;
      }
      EXPECT_EQ(t.makespan, (m + p - 1) * 3ms);
      // A link time of 1% of a forward adds 2(p−1) hops to the critical path: a small margin.
      auto linked = kUnitCosts;
      linked.link = 10us;
      const auto tl = simulate_schedule(make_1f1b(p, m), linked);
      EXPECT_NEAR(tl.bubble, theory, 0.01) << "p=" << p << " m=" << m;
      EXPECT_GE(tl.makespan, t.makespan);
    }
  }
}

TEST(PipelineScheduleSimulateTest, GPipeBubbleMatchesOneFOneB) {
  const auto t = simulate_schedule(make_gpipe(4, 8), kUnitCosts);
  EXPECT_NEAR(t.bubble, 3.0 / 11.0, 1e-9);
}

TEST(PipelineScheduleSimulateTest, InterleavedDividesTheBubbleByTheVirtualStages) {
  for (int p : {2, 3, 4, 8}) {
    for (int v : {2, 3, 4}) {
      const int m = 2 * p;
      // Each virtual stage holds 1/v of a rank's layers, so its actions cost 1/v.
      const Nanoseconds unit = Nanoseconds(1ms) / v;
      const ScheduleCosts costs{.forward = unit, .backward_input = unit, .backward_weight = unit};
      const auto t = simulate_schedule(make_interleaved_1f1b(p, m, v), costs);
      const double theory = static_cast<double>(p - 1) / (v * m + p - 1);
      EXPECT_NEAR(t.bubble, theory, 0.01) << "p=" << p << " v=" << v;
      const double one_f_one_b = simulate_schedule(make_1f1b(p, m), kUnitCosts).bubble;
      // (v·m + p−1)/(m + p−1): between 0.75·v and v for m = 2p.
      EXPECT_GE(one_f_one_b / t.bubble, 0.75 * v) << "p=" << p << " v=" << v;
      EXPECT_LE(one_f_one_b / t.bubble, v + 0.01) << "p=" << p << " v=" << v;
    }
  }
}

TEST(PipelineScheduleSimulateTest, ZeroBubbleIdlesLessThanOneFOneB) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const auto zb = simulate_schedule(make_zero_bubble_h1(p, m), kUnitCosts);
      const auto one = simulate_schedule(make_1f1b(p, m), kUnitCosts);
      // ZB-H1: each rank idles (p−1)(F+B−W) = (p−1) ms instead of 1F1B's 3(p−1) ms.
      EXPECT_EQ(zb.makespan, m * 3ms + (p - 1) * 1ms) << "p=" << p << " m=" << m;
      for (int r = 0; r < p; ++r) {
        EXPECT_LT(zb.idle_fraction[r], one.idle_fraction[r]) << "p=" << p << " m=" << m;
        EXPECT_NEAR(zb.idle_fraction[r], (p - 1.0) / (3.0 * m + p - 1), 1e-9);
      }
    }
  }
}

TEST(PipelineScheduleSimulateTest, LinksCarryOneTransferAtATime) {
  // GPipe on 2 ranks with free compute except forwards: rank 0's sends queue on one link.
  const ScheduleCosts costs{.forward = 1ms, .link = 5ms};
  const auto t = simulate_schedule(make_gpipe(2, 3), costs);
  // Arrivals at 5+1, 11+... : sends posted at 1, 2, 3 arrive at 6, 11, 16; rank 1's last
  // forward runs 16..17, then the backward gradients (free compute) cross back in 3 × 5 ms.
  EXPECT_EQ(t.finish[1], 17ms);
  EXPECT_EQ(t.makespan, 17ms + 15ms);
  EXPECT_EQ(link_time(20us, 1'000'000, 1e9), 1020us);
}

TEST(PipelineScheduleSimulateTest, TimelineDrawsTheSchedule) {
  // 1F1B, p = 2, m = 2, F = 1, BW = 2 units: rank 1 runs F0 at 1, BW0 at 2..4, F1 at 4, BW1 at
  // 5..7; rank 0 runs F0, F1, then BW0 once rank 1's gradient is in (4..6), BW1 at 7..9.
  const auto s = make_1f1b(2, 2);
  const auto t = simulate_schedule(s, kUnitCosts);
  EXPECT_EQ(format_timeline(s, t, 1ms),
            "rank 0 | F0 F1 .  .  B0--- .  B1---\n"
            "rank 1 | .  F0 B0--- F1 B1--- .  .\n");
  EXPECT_NEAR(t.bubble, 1.0 / 3.0, 1e-9);
}

// The link time is the fake backend's: a send of an activation costs there what link_time says.
// Over links of that cost (2.4% of a forward) 1F1B stays near (p−1)/(m+p−1): each link on the
// path of the first forward and the last backward delays the end, and round trips in the steady
// state add a little more.
TEST(PipelineScheduleSimulateTest, LinkTimeIsTheFakeBackendsModel) {
  auto log = std::make_shared<fake::FakeLog>();
  auto pg =
      fake::create_process_group(0, 2, {.log = log, .latency = 20us, .bytes_per_second = 1e9});
  const Tensor activation = zeros({1000});  // 4,000 bytes
  pg->send(activation, 1).wait();
  const auto calls = log->calls();
  ASSERT_EQ(calls.size(), 1u);
  const Nanoseconds link = link_time(20us, activation.nbytes(), 1e9);
  EXPECT_EQ(link, 24us);  // 20 us + 4,000 B / 1 GB/s
  EXPECT_EQ(calls[0].modeled, link);

  const int p = 4;
  const int m = 16;
  auto costs = kUnitCosts;
  costs.link = link;
  const auto t = simulate_schedule(make_1f1b(p, m), costs);
  // The last rank starts after p−1 forwards and links, and the last backward needs p−1 more.
  EXPECT_GE(t.makespan, (m + p - 1) * 3ms + 2 * (p - 1) * link);
  EXPECT_NEAR(t.bubble, (p - 1.0) / (m + p - 1), 0.02);
}

// docs/parallel.md shows each built-in schedule as format_timeline draws it (p = 3, m = 6,
// F = B = W = one cell, interleaved with v = 2 and half-unit cells).
TEST(PipelineScheduleSimulateTest, DocumentedDiagramsMatchTheTimingModel) {
  std::ifstream in(PARALLEL_DOC_PATH);
  ASSERT_TRUE(in) << PARALLEL_DOC_PATH;
  std::stringstream doc;
  doc << in.rdbuf();
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"}) {
    const auto s = make_schedule(name, 3, 6);
    const Nanoseconds unit = Nanoseconds(1ms) / s.virtual_stages();
    const auto t =
        simulate_schedule(s, {.forward = unit, .backward_input = unit, .backward_weight = unit});
    const std::string diagram = "```\n" + format_timeline(s, t, unit) + "```\n";
    EXPECT_NE(doc.str().find(diagram), std::string::npos)
        << name << " is drawn differently in docs/parallel.md; now:\n"
        << diagram;
  }
}

}  // namespace
}  // namespace tessel::pp
