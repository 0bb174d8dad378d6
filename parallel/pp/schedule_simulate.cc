// The timing model: each rank's clock runs through its list; receives wait for arrivals.
#include "tessel/parallel/pp/schedule_simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>

#include "tessel/base/error.h"
#include "tessel/parallel/pp/schedule_validate.h"

namespace tessel::pp {
namespace {

Nanoseconds cost_of(const Action& a, const ScheduleCosts& c) {
  switch (a.kind) {
    case ActionKind::kForward:
      return c.forward;
    case ActionKind::kBackwardInput:
      return c.backward_input;
    case ActionKind::kBackwardWeight:
      return c.backward_weight;
    case ActionKind::kBackward:
      return c.backward_input + c.backward_weight;
    case ActionKind::kStep:
      return c.step;
    default:
      return Nanoseconds{0};
  }
}

std::string label_of(const Action& a, int num_ranks) {
  char letter = 'S';
  switch (a.kind) {
    case ActionKind::kForward:
      letter = 'F';
      break;
    case ActionKind::kBackwardInput:
    case ActionKind::kBackward:
      letter = 'B';
      break;
    case ActionKind::kBackwardWeight:
      letter = 'W';
      break;
    default:
      return "S";
  }
  if ((a.stage / num_ranks) % 2 == 1) {
    letter = static_cast<char>(std::tolower(static_cast<unsigned char>(letter)));
  }
  return fmt::format("{}{}", letter, a.microbatch);
}

}  // namespace

Nanoseconds link_time(Nanoseconds latency, int64_t bytes, double bytes_per_second) {
  if (bytes_per_second <= 0) {
    throw InvalidArgument(
        fmt::format("link_time: bytes_per_second {}; expected > 0", bytes_per_second));
  }
  return latency + Nanoseconds(static_cast<int64_t>(std::llround(1e9 * bytes / bytes_per_second)));
}

ScheduleTimeline simulate_schedule(const PipelineSchedule& s, const ScheduleCosts& costs) {
  validate_schedule(s);
  const int p = s.num_ranks;
  ScheduleTimeline t;
  t.ranks.resize(p);
  t.busy.assign(p, Nanoseconds{0});
  std::vector<Nanoseconds> clock(p, Nanoseconds{0});
  std::vector<size_t> pc(p, 0);
  // Per link (sender * p + receiver): arrival times of posted tensors, in send order, and when
  // the link is free for the next transfer.
  std::vector<std::deque<Nanoseconds>> in_flight(static_cast<size_t>(p) * p);
  std::vector<Nanoseconds> link_free(static_cast<size_t>(p) * p, Nanoseconds{0});

  // A validated schedule completes, so this loop ends with every pc at its list's end.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = s.ranks[r];
      while (pc[r] < list.size()) {
        const Action& a = list[pc[r]];
        if (is_recv(a.kind)) {
          auto& q = in_flight[static_cast<size_t>(a.peer) * p + r];
          if (q.empty()) break;  // the peer has not sent it yet: come back later
          clock[r] = std::max(clock[r], q.front());
          q.pop_front();
        } else if (is_send(a.kind)) {
          const size_t link = static_cast<size_t>(r) * p + a.peer;
          const Nanoseconds arrival = std::max(clock[r], link_free[link]) + costs.link;
          link_free[link] = arrival;
          in_flight[link].push_back(arrival);
        } else {
          const Nanoseconds d = cost_of(a, costs);
          t.ranks[r].push_back({static_cast<int>(pc[r]), a, clock[r], clock[r] + d});
          clock[r] += d;
          t.busy[r] += d;
        }
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (pc[r] != s.ranks[r].size()) {
      throw Internal(
          fmt::format("pipeline timing model: rank {} stopped at action {} of a "
                      "validated schedule",
                      r, pc[r] + 1));
    }
  }
  t.finish = clock;
  t.makespan = *std::max_element(clock.begin(), clock.end());
  t.idle_fraction.resize(p);
  for (int r = 0; r < p; ++r) {
    t.idle_fraction[r] = t.makespan.count() > 0 ? 1.0 - static_cast<double>(t.busy[r].count()) /
                                                            static_cast<double>(t.makespan.count())
                                                : 0.0;
    t.bubble += t.idle_fraction[r] / p;
  }
  return t;
}

std::string format_timeline(const PipelineSchedule& s, const ScheduleTimeline& t, Nanoseconds unit,
                            int width) {
  if (unit.count() <= 0) {
    throw InvalidArgument(fmt::format("format_timeline: unit {} ns; expected > 0", unit.count()));
  }
  if (width <= 0) {
    for (const auto& row : t.ranks) {
      for (const auto& x : row) {
        width = std::max(width, static_cast<int>(label_of(x.action, s.num_ranks).size()) + 1);
      }
    }
    width = std::max(width, 2);
  }
  const int64_t cells = (t.makespan.count() + unit.count() - 1) / unit.count();
  std::string idle_cell = "." + std::string(width - 1, ' ');
  std::string out;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    std::string row;
    for (int64_t c = 0; c < cells; ++c) row += idle_cell;
    for (const auto& x : t.ranks[r]) {
      const int64_t first = x.start.count() / unit.count();
      const int64_t last = x.end.count() / unit.count();  // exclusive
      if (last <= first) continue;
      const size_t span = static_cast<size_t>((last - first) * width);
      std::string text = label_of(x.action, s.num_ranks);
      text.resize(std::min(text.size(), span - 1));
      text += std::string(span - 1 - text.size(), '-');
      text += ' ';
      row.replace(static_cast<size_t>(first * width), span, text);
    }
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += fmt::format("rank {} | {}\n", r, row);
  }
  return out;
}

}  // namespace tessel::pp
