#include "tessel/launcher/round_state.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

namespace tessel::launcher {
namespace {

using Phase = RoundState::Phase;
using std::chrono::hours;
using std::chrono::nanoseconds;

TEST(RoundStateTest, CleanRoundReportsCompletionOnce) {
  RoundState round;
  EXPECT_EQ(round.phase(), Phase::kRunning);
  EXPECT_TRUE(round.kill_deadline().is_never());
  EXPECT_TRUE(round.all_workers_exited());
  EXPECT_EQ(round.phase(), Phase::kDone);
  EXPECT_FALSE(round.all_workers_exited());  // reported once
  EXPECT_FALSE(round.over(0));               // no event yet
  EXPECT_TRUE(round.server_decided(RoundEnd::kFinal, hours(1)));
  EXPECT_EQ(round.phase(), Phase::kStopping);
  EXPECT_TRUE(round.over(0));
  EXPECT_EQ(round.end(), RoundEnd::kFinal);
}

TEST(RoundStateTest, FirstFailureStopsTheRoundAndLaterOnesAreNotReported) {
  RoundState round;
  EXPECT_TRUE(round.worker_failed());
  round.stop_after_failure(hours(1));
  EXPECT_EQ(round.phase(), Phase::kStopping);
  EXPECT_FALSE(round.kill_deadline().is_never());
  EXPECT_FALSE(round.worker_failed());
  EXPECT_TRUE(round.any_failed());
  EXPECT_FALSE(round.all_workers_exited());  // a failed round never reports completion
  // Already stopping: the server's event ends the round without a second SIGTERM.
  EXPECT_FALSE(round.server_decided(RoundEnd::kRestart, hours(1)));
  EXPECT_FALSE(round.over(1));
  EXPECT_TRUE(round.over(0));
  EXPECT_EQ(round.end(), RoundEnd::kRestart);
}

TEST(RoundStateTest, HoldForDumpsUntilTheServerDecides) {
  RoundState round;
  EXPECT_TRUE(round.worker_failed());
  round.hold_for_dumps(hours(1));
  EXPECT_EQ(round.phase(), Phase::kHolding);
  EXPECT_TRUE(round.stopping());
  EXPECT_FALSE(round.worker_failed());  // a peer that lost the failed rank: not reported
  // An interrupt while holding keeps the hold; the server's event still stops the workers.
  EXPECT_EQ(round.interrupted(SIGTERM, hours(1)), RoundState::Interrupt::kForward);
  EXPECT_EQ(round.phase(), Phase::kHolding);
  EXPECT_TRUE(round.server_decided(RoundEnd::kFinal, hours(1)));
  EXPECT_EQ(round.phase(), Phase::kStopping);
}

TEST(RoundStateTest, SecondSigintKillsNowAndOtherInterruptsForward) {
  RoundState round;
  EXPECT_EQ(round.interrupted(SIGINT, hours(1)), RoundState::Interrupt::kForward);
  EXPECT_EQ(round.phase(), Phase::kStopping);
  EXPECT_FALSE(round.worker_failed());  // interrupted workers' exits are not failures to report
  EXPECT_EQ(round.interrupted(SIGTERM, hours(1)), RoundState::Interrupt::kForward);
  EXPECT_EQ(round.interrupted(SIGINT, hours(1)), RoundState::Interrupt::kKillNow);
}

TEST(RoundStateTest, KillIsDueOnceTheDeadlinePasses) {
  RoundState round;
  EXPECT_FALSE(round.kill_due());  // no deadline
  EXPECT_TRUE(round.worker_failed());
  round.stop_after_failure(hours(1));
  EXPECT_FALSE(round.kill_due());
  EXPECT_FALSE(round.server_decided(RoundEnd::kLinkLost, hours(1)));
  EXPECT_EQ(round.interrupted(SIGHUP, nanoseconds(0)), RoundState::Interrupt::kForward);
  EXPECT_TRUE(round.kill_due());
  EXPECT_TRUE(round.kill_deadline().is_never());  // cleared after it fired
  EXPECT_FALSE(round.kill_due());
}

TEST(RoundStateTest, ServerLossWhileRunningStopsTheWorkers) {
  RoundState round;
  EXPECT_TRUE(round.server_decided(RoundEnd::kLinkLost, hours(1)));
  EXPECT_EQ(round.phase(), Phase::kStopping);
  EXPECT_FALSE(round.all_workers_exited());
  EXPECT_TRUE(round.over(0));
  EXPECT_EQ(round.end(), RoundEnd::kLinkLost);
}

}  // namespace
}  // namespace tessel::launcher
