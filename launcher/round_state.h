#pragma once
// Where the node agent's supervision of one round of workers stands: its phase (running,
// completion reported, holding the workers for a hang's dumps, stopping them), whether a worker
// failed, the SIGKILL deadline, the interrupts received and the server's decision. The
// supervise loop calls one named transition per thing it sees and does the I/O the transition
// asks for (signals to the workers, reports to the server); this class does none.
//
//   kRunning --all_workers_exited()--> kDone          (the agent reports completion)
//   kRunning, kDone --worker_failed() + hold_for_dumps()-----> kHolding
//                   --worker_failed() + stop_after_failure()-> kStopping
//   kRunning, kDone --interrupted()--> kStopping   (kHolding stays kHolding)
//   any but kStopping --server_decided()--> kStopping (the agent sends SIGTERM)
//   the round is over() once the server decided and no worker runs.
//
// Not thread-safe: owned by the supervise loop of one round.

#include <optional>

#include "tessel/base/clock.h"

namespace tessel::launcher {

// How a round ended, by the server's event (or its loss).
enum class RoundEnd {
  kRestart,   // the server restarts the job: join the next round
  kFinal,     // the job succeeded or failed for good: the event carries the outcome
  kLinkLost,  // the server stopped answering heartbeats: join the job again
};

class RoundState {
 public:
  enum class Phase {
    kRunning,   // workers run; nothing reported for the round
    kDone,      // every worker exited 0 and completion was reported; waiting for the event
    kHolding,   // a worker failed on the hang path: the others are kept alive until the
                // server's event (it gathers every rank's dump first)
    kStopping,  // the workers were told to stop (a failure, a signal, or the server's event)
  };
  // What the agent does with an interrupt (SIGINT, SIGTERM, SIGHUP).
  enum class Interrupt {
    kForward,  // forward it to the workers and report the interrupt to the server
    kKillNow,  // a second SIGINT: SIGKILL the workers now; nothing else changes
  };

  Phase phase() const { return phase_; }
  // Failures are no longer reported once the round is stopping (holding included).
  bool stopping() const { return phase_ == Phase::kHolding || phase_ == Phase::kStopping; }
  bool any_failed() const { return any_failed_; }
  // When the workers get SIGKILL (never() when not planned).
  const Deadline& kill_deadline() const { return kill_at_; }
  // The server's decision, once it came.
  std::optional<RoundEnd> end() const { return end_; }

  // A worker exited non-zero or by a signal. Returns true when it is the round's first failure
  // to report (the round is not stopping yet); the agent then reports it and calls
  // hold_for_dumps or stop_after_failure.
  bool worker_failed();
  // The first failure takes the hang path: the other workers stay alive, SIGKILL after HOLD
  // (a bound in case no event comes). -> kHolding.
  void hold_for_dumps(Nanoseconds hold);
  // The first failure stops the other workers now (the agent sends SIGTERM), SIGKILL after
  // GRACE. -> kStopping.
  void stop_after_failure(Nanoseconds grace);
  // No worker runs. Returns true, once, when every worker succeeded and the round is not
  // stopping: the agent reports completion. -> kDone.
  bool all_workers_exited();
  // An interrupt SIG (not SIGUSR1/2, which are only forwarded). A second SIGINT is kKillNow.
  // Otherwise SIGKILL after GRACE, and kRunning or kDone -> kStopping (a hold stays a hold: the
  // server's event still ends it).
  Interrupt interrupted(int sig, Nanoseconds grace);
  // The server's decision for the round (or its loss). Returns true when the agent must stop
  // the workers now (SIGTERM, SIGKILL after GRACE): when they were not already being stopped,
  // or were held for dumps. -> kStopping.
  bool server_decided(RoundEnd end, Nanoseconds grace);
  // Returns true once the SIGKILL deadline passed (the agent sends SIGKILL); the deadline is
  // then cleared.
  bool kill_due();
  // The round is over: the server decided and no worker runs (RUNNING workers left).
  bool over(int running) const { return end_.has_value() && running == 0; }

 private:
  Phase phase_ = Phase::kRunning;
  bool any_failed_ = false;
  int interrupts_ = 0;
  Deadline kill_at_ = Deadline::never();
  std::optional<RoundEnd> end_;
};

}  // namespace tessel::launcher
