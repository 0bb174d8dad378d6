#pragma once
// Pipeline schedules as data: an action (forward, backward-input, backward-weight, full backward,
// send/receive of an activation or a gradient, optimizer step), a schedule (per rank, an ordered
// list of actions), and their plain text form. Generators are in schedule_generate.h, the checks
// in schedule_validate.h, the timing model in schedule_simulate.h; runtime.h executes them.
//
// Layout. A schedule has S stages over p ranks (S = v·p, v virtual stages per rank); stage s
// lives on rank s % p (the "loop" layout of interleaved 1F1B; v = 1 gives stage s on rank s).
// Micro-batch i flows forward from stage 0 to S−1, and its gradient back from S−1 to 0.
//
// Text form. One action per whitespace-separated token (m = micro-batch, s = stage, q = rank):
//
//   Fm s      F3s1           forward of micro-batch 3 on stage 1
//   Bm s      B3s1           backward-input (gradient of the stage's input; ZB's "B")
//   Wm s      W3s1           backward-weight (gradient of the stage's weights; ZB's "W")
//   BWm s     BW3s1          full backward (B and W in one action)
//   SEND_F    SEND_F3s1>2    send the activation stage 1 produced for micro-batch 3 to rank 2
//   RECV_F    RECV_F3s2<1    receive from rank 1 the activation stage 2 consumes for micro-batch 3
//   SEND_B    SEND_B3s2>1    send the input gradient stage 2 produced for micro-batch 3 to rank 1
//   RECV_B    RECV_B3s1<2    receive from rank 2 the output gradient stage 1 consumes
//   STEP      STEP           the optimizer step
//
// The stage in a token is always the stage this rank serves with it: a send names the stage
// that produced the tensor, a receive the stage that consumes it, so SEND_F3s1>2 on rank 1 is
// matched by RECV_F3s2<1 on rank 2. A whole schedule is a header line and one line per rank:
//
//   pipeline ranks=2 stages=2 microbatches=2
//   0: F0s0 SEND_F0s0>1 F1s0 SEND_F1s0>1 RECV_B0s0<1 BW0s0 RECV_B1s0<1 BW1s0 STEP
//   1: RECV_F0s1<0 F0s1 BW0s1 SEND_B0s1>0 RECV_F1s1<0 F1s1 BW1s1 SEND_B1s1>0 STEP
//
// '#' starts a comment to the end of the line. Malformed text throws InvalidArgument naming
// the line, the token, its position (1-based) and what was expected.
//
// Types here are plain values; none is shared between threads by tessel.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::pp {

enum class ActionKind {
  kForward,         // F
  kBackwardInput,   // B
  kBackwardWeight,  // W
  kBackward,        // BW: B and W in one action
  kSendActivation,  // SEND_F
  kRecvActivation,  // RECV_F
  kSendGradient,    // SEND_B
  kRecvGradient,    // RECV_B
  kStep,            // STEP
};

// True for F, B, W and BW: the actions that take compute time.
bool is_compute(ActionKind kind);
bool is_send(ActionKind kind);
bool is_recv(ActionKind kind);

// One action of one rank. microbatch, stage and peer are -1 where the kind has none (STEP has
// none; compute actions have no peer).
struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = -1;
  int stage = -1;
  int peer = -1;

  friend bool operator==(const Action&, const Action&) = default;
};

Action forward(int microbatch, int stage);
Action backward_input(int microbatch, int stage);
Action backward_weight(int microbatch, int stage);
Action backward(int microbatch, int stage);
Action step();

// "F3s1", "SEND_F3s1>2", "STEP": the action's token.
std::string to_string(const Action& action);
// The inverse of to_string. Throws InvalidArgument naming the token and what was expected.
Action parse_action(std::string_view token);

// Tokens separated by one space.
std::string format_actions(const std::vector<Action>& actions);
// Whitespace-separated tokens; an error names the token and its 1-based position.
std::vector<Action> parse_actions(std::string_view text);

// A whole pipeline: num_stages stages (a multiple of num_ranks) over num_ranks ranks, each rank
// with its ordered list of actions. `name` is informational ("1f1b", ...).
struct PipelineSchedule {
  std::string name;
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order

  int virtual_stages() const { return num_ranks > 0 ? num_stages / num_ranks : 0; }
  // The rank that runs stage s: s % num_ranks.
  int stage_rank(int stage) const { return stage % num_ranks; }
};

// The text form above (header line, then "r: tokens" per rank), ending in a newline.
std::string format_schedule(const PipelineSchedule& schedule);
// Parses format_schedule's form. Checks the grammar and that ranks 0..p−1 each appear once, in
// order; whether the schedule can run is validate_schedule's job.
PipelineSchedule parse_schedule(std::string_view text);

}  // namespace tessel::pp
