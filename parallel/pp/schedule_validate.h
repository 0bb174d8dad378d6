#pragma once
// The checks a pipeline schedule (tessel/parallel/pp/schedule.h) passes before anything runs.
// Pure data in, so every rank reaches the same verdict and the same message.

#include <vector>

#include "tessel/parallel/pp/schedule.h"

namespace tessel::pp {

// What validate_schedule learned about a schedule that passed.
struct ScheduleCheck {
  // peak_in_flight[r]: the most micro-batch activations rank r holds at once, over all its
  // stages. An activation is held from its F until its BW, or until its W when the backward is
  // split (W needs the stage's input).
  std::vector<int> peak_in_flight;
};

// Checks, in this order, and throws InvalidArgument at the first failure with a message that
// names the rank, the action (its position and token) and why:
//  1. sizes: p ≥ 1, S a positive multiple of p, m ≥ 1; every action's micro-batch and stage in
//     range, its stage on this rank (s % p), its peer the rank of the neighbouring stage and not
//     this rank; at most one STEP per rank, after all of the rank's compute; at least 2·m·S
//     actions in all (before tables are sized by m and S);
//  2. completeness: each (micro-batch, stage) has one F and either one BW or one B and one W, on
//     its rank; each boundary between stages on different ranks has one send and one receive of
//     the activation and of the gradient;
//  3. local data flow: an F after the F of the previous stage (same rank) or its RECV_F; a B/BW
//     after its F and after the next stage's backward (same rank) or its RECV_B; a W after its
//     B; a send after the compute that produced its tensor;
//  4. matching order: between two ranks, receives come in the order the peer sends (p2p
//     messages are matched in order, per peer);
//  5. no deadlock: the ranks' lists are run with asynchronous sends and blocking receives until
//     all complete; if they cannot, the message names every blocked rank, its action, and what
//     the peer it waits for is blocked on.
ScheduleCheck validate_schedule(const PipelineSchedule& schedule);

}  // namespace tessel::pp
