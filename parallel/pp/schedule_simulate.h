#pragma once
// A timing model of a pipeline schedule (tessel/parallel/pp/schedule.h): modeled time, never
// wall time. Each rank runs its list in order; a compute action takes its cost; a send posts
// and the rank goes on, the tensor reaching the peer one link time later (transfers on one link,
// sender → receiver, go one at a time, as on the fake backend where a group is one link); a
// receive waits until its tensor has arrived. From that: per rank busy time, idle fraction
// (the bubble) and the makespan.
//
//   auto s = pp::make_1f1b(4, 8);
//   auto t = pp::simulate_schedule(s, {.forward = 1ms, .backward_input = 1ms,
//                                      .backward_weight = 1ms});
//   t.idle_fraction[0];               // 3/11 for 1F1B: (p−1)/(m+p−1)
//   fmt::print("{}", pp::format_timeline(s, t, 1ms));
//
// The link time for a tensor of B bytes on the fake backend's link model is
// latency + B / bytes_per_second (see link_time()).

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/parallel/pp/schedule.h"

namespace tessel::pp {

// Modeled cost of each kind of action. A full backward (BW) costs backward_input +
// backward_weight. Sends and receives take no compute time; `link` is the time from a send's
// post to its arrival (latency included).
struct ScheduleCosts {
  Nanoseconds forward{0};
  Nanoseconds backward_input{0};
  Nanoseconds backward_weight{0};
  Nanoseconds step{0};
  Nanoseconds link{0};
};

// latency + bytes / bytes_per_second: the fake backend's time model for one transfer.
Nanoseconds link_time(Nanoseconds latency, int64_t bytes, double bytes_per_second);

// One compute action (or STEP) as the model ran it.
struct TimedAction {
  int index = 0;  // position in the rank's list
  Action action;
  Nanoseconds start{0};
  Nanoseconds end{0};
};

struct ScheduleTimeline {
  std::vector<std::vector<TimedAction>> ranks;  // per rank, its compute actions and STEP
  std::vector<Nanoseconds> busy;                // per rank, time spent computing
  std::vector<Nanoseconds> finish;              // per rank, when its last action ended
  Nanoseconds makespan{0};                      // when the last rank finished (all start at 0)
  // per rank, 1 − busy/makespan: the share of the step the rank waits.
  std::vector<double> idle_fraction;
  // The mean of idle_fraction.
  double bubble = 0;
};

// Runs the model. The schedule must pass validate_schedule (this calls it, and throws its
// InvalidArgument otherwise).
ScheduleTimeline simulate_schedule(const PipelineSchedule& schedule, const ScheduleCosts& costs);

// An ASCII chart, one row per rank, one column of `width` characters per `unit` of modeled time:
// each compute action shows its letter and micro-batch ("F3", "B3", "W3"; a full backward shows
// "B3" over its longer span, filled with '-'), in upper case on even virtual stages (chunks) and
// lower case on odd ones; '.' is idle. Times are rounded down to whole units. width 0 picks the
// widest label plus one.
std::string format_timeline(const PipelineSchedule& schedule, const ScheduleTimeline& timeline,
                            Nanoseconds unit, int width = 0);

}  // namespace tessel::pp
