// The built-in schedules: compute order per rank, then add_communication.
#include "tessel/parallel/pp/schedule_generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>

#include "tessel/base/error.h"

namespace tessel::pp {
namespace {

PipelineSchedule empty_schedule(std::string name, int p, int m, int v) {
  if (p < 1) {
    throw InvalidArgument(fmt::format("{} schedule: {} ranks; expected at least 1", name, p));
  }
  if (m < 1) {
    throw InvalidArgument(
        fmt::format("{} schedule: {} micro-batches; expected at least 1", name, m));
  }
  if (v < 1) {
    throw InvalidArgument(
        fmt::format("{} schedule: {} virtual stages per rank; expected at least 1", name, v));
  }
  PipelineSchedule s;
  s.name = std::move(name);
  s.num_ranks = p;
  s.num_stages = p * v;
  s.num_microbatches = m;
  s.ranks.resize(p);
  return s;
}

void require_at_least_ranks(const PipelineSchedule& s) {
  if (s.num_microbatches < s.num_ranks) {
    throw InvalidArgument(fmt::format(
        "{} schedule: {} micro-batches for {} ranks; expected at least one micro-batch per rank "
        "(m >= p), or use gpipe",
        s.name, s.num_microbatches, s.num_ranks));
  }
}

}  // namespace

void add_communication(PipelineSchedule& s) {
  const int last = s.num_stages - 1;
  for (int r = 0; r < s.num_ranks; ++r) {
    std::vector<Action> out;
    for (const Action& a : s.ranks[r]) {
      const int mb = a.microbatch;
      const int st = a.stage;
      // Receive right before the compute that consumes another rank's tensor.
      if (a.kind == ActionKind::kForward && st > 0 && s.stage_rank(st - 1) != r) {
        out.push_back({ActionKind::kRecvActivation, mb, st, s.stage_rank(st - 1)});
      }
      if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) && st < last &&
          s.stage_rank(st + 1) != r) {
        out.push_back({ActionKind::kRecvGradient, mb, st, s.stage_rank(st + 1)});
      }
      out.push_back(a);
      // Send right after the compute that produces a tensor another rank consumes.
      if (a.kind == ActionKind::kForward && st < last && s.stage_rank(st + 1) != r) {
        out.push_back({ActionKind::kSendActivation, mb, st, s.stage_rank(st + 1)});
      }
      if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) && st > 0 &&
          s.stage_rank(st - 1) != r) {
        out.push_back({ActionKind::kSendGradient, mb, st, s.stage_rank(st - 1)});
      }
    }
    out.push_back(step());
    s.ranks[r] = std::move(out);
  }
}

PipelineSchedule make_gpipe(int p, int m) {
  auto s = empty_schedule("gpipe", p, m, 1);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) s.ranks[r].push_back(forward(i, r));
    for (int i = 0; i < m; ++i) s.ranks[r].push_back(backward(i, r));
  }
  add_communication(s);
  return s;
}

PipelineSchedule make_1f1b(int p, int m) {
  auto s = empty_schedule("1f1b", p, m, 1);
  require_at_least_ranks(s);
  for (int r = 0; r < p; ++r) {
    auto& list = s.ranks[r];
    const int warmup = p - 1 - r;
    int next_f = 0;
    int next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back(forward(next_f, r));
    // Steady state: one forward, one backward.
    for (; next_f < m; ++next_f, ++next_b) {
      list.push_back(forward(next_f, r));
      list.push_back(backward(next_b, r));
    }
    for (; next_b < m; ++next_b) list.push_back(backward(next_b, r));
  }
  add_communication(s);
  return s;
}

PipelineSchedule make_interleaved_1f1b(int p, int m, int v) {
  auto s = empty_schedule("interleaved-1f1b", p, m, v);
  require_at_least_ranks(s);
  if (m % p != 0) {
    throw InvalidArgument(fmt::format(
        "interleaved-1f1b schedule: {} micro-batches for {} ranks; expected a multiple of the "
        "rank count (micro-batches go through each virtual stage in groups of p)",
        m, p));
  }
  const int total = m * v;  // forwards (and backwards) per rank
  // The k-th forward of a rank: micro-batches in groups of p, each group through chunk 0, then
  // chunk 1, ...; backwards walk the chunks in reverse.
  auto micro_batch = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward_chunk = [&](int k) { return (k % (p * v)) / p; };
  auto backward_chunk = [&](int k) { return v - 1 - (k % (p * v)) / p; };
  for (int r = 0; r < p; ++r) {
    auto& list = s.ranks[r];
    const int warmup = std::min(total, (p - r - 1) * 2 + (v - 1) * p);
    int next_f = 0;
    int next_b = 0;
    auto push_f = [&] {
      list.push_back(forward(micro_batch(next_f), forward_chunk(next_f) * p + r));
      ++next_f;
    };
    auto push_b = [&] {
      list.push_back(backward(micro_batch(next_b), backward_chunk(next_b) * p + r));
      ++next_b;
    };
    while (next_f < warmup) push_f();
    while (next_f < total) {
      push_f();
      push_b();
    }
    while (next_b < total) push_b();
  }
  add_communication(s);
  return s;
}

PipelineSchedule make_zero_bubble_h1(int p, int m) {
  auto s = empty_schedule("zero-bubble", p, m, 1);
  require_at_least_ranks(s);
  for (int r = 0; r < p; ++r) {
    auto& list = s.ranks[r];
    std::deque<int> pending_w;  // micro-batches whose B ran and whose W has not
    const int may_defer = r;    // the later the stage, the more W's wait (B's path stays short)
    auto push_b = [&](int i) {
      list.push_back(backward_input(i, r));
      pending_w.push_back(i);
      while (static_cast<int>(pending_w.size()) > may_defer) {
        list.push_back(backward_weight(pending_w.front(), r));
        pending_w.pop_front();
      }
    };
    const int warmup = p - 1 - r;
    int next_f = 0;
    int next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back(forward(next_f, r));
    for (; next_f < m; ++next_f, ++next_b) {
      list.push_back(forward(next_f, r));
      push_b(next_b);
    }
    for (; next_b < m; ++next_b) push_b(next_b);
    for (int i : pending_w) list.push_back(backward_weight(i, r));
  }
  add_communication(s);
  return s;
}

PipelineSchedule make_schedule(std::string_view name, int p, int m, int v) {
  if (name == "gpipe") return make_gpipe(p, m);
  if (name == "1f1b") return make_1f1b(p, m);
  if (name == "interleaved-1f1b") return make_interleaved_1f1b(p, m, v);
  if (name == "zero-bubble") return make_zero_bubble_h1(p, m);
  throw InvalidArgument(fmt::format(
      "pipeline schedule '{}' is unknown; expected gpipe, 1f1b, interleaved-1f1b or zero-bubble",
      name));
}

}  // namespace tessel::pp
