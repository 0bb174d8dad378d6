#include "tessel/launcher/round_state.h"

#include <signal.h>

namespace tessel::launcher {

bool RoundState::worker_failed() {
  any_failed_ = true;
  return !stopping();
}

void RoundState::hold_for_dumps(Nanoseconds hold) {
  phase_ = Phase::kHolding;
  kill_at_ = Deadline::after(hold);
}

void RoundState::stop_after_failure(Nanoseconds grace) {
  phase_ = Phase::kStopping;
  kill_at_ = Deadline::after(grace);
}

bool RoundState::all_workers_exited() {
  if (phase_ != Phase::kRunning || any_failed_) return false;
  phase_ = Phase::kDone;
  return true;
}

RoundState::Interrupt RoundState::interrupted(int sig, Nanoseconds grace) {
  ++interrupts_;
  if (sig == SIGINT && interrupts_ > 1) return Interrupt::kKillNow;
  if (phase_ == Phase::kRunning || phase_ == Phase::kDone) phase_ = Phase::kStopping;
  kill_at_ = Deadline::after(grace);
  return Interrupt::kForward;
}

bool RoundState::server_decided(RoundEnd end, Nanoseconds grace) {
  end_ = end;
  if (phase_ == Phase::kStopping) return false;  // already told to stop: keep its deadline
  phase_ = Phase::kStopping;
  kill_at_ = Deadline::after(grace);
  return true;
}

bool RoundState::kill_due() {
  if (!kill_at_.expired()) return false;
  kill_at_ = Deadline::never();
  return true;
}

}  // namespace tessel::launcher
