#include "tessel/flight_recorder/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

namespace tessel::fr {
namespace {

std::string tensor_text(const TensorMeta& t) {
  if (t.dtype[0] == '\0') return "-";
  std::string dims;
  for (int i = 0; i < t.ndim; ++i) dims += fmt::format("{}{}", i ? "," : "", t.shape[i]);
  return fmt::format("{}[{}]", t.dtype, dims);
}

std::string group_label(const RankDump& d, uint64_t id) {
  for (const auto& g : d.groups) {
    if (g.id == id) return g.name;
  }
  return fmt::format("#{}", id);
}

std::string entry_name(const RankDump& d, const TraceEntry& e) {
  if (e.is_user_event() || e.is_span()) return e.text;
  if (e.is_p2p()) {
    return fmt::format("{} #{} peer {} ({})", op_name(e.op), e.p2p_seq, e.peer,
                       group_label(d, e.group_id));
  }
  return fmt::format("{} #{} ({})", op_name(e.op), e.seq, group_label(d, e.group_id));
}

// A pipeline runtime's compute action span: "F mb3 s1", "B ...", "W ...", "BW ..." (see
// parallel/pp/runtime.cc); these go on the rank's pipeline track.
bool is_pipeline_action(std::string_view text) {
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) return false;
  const std::string_view kind = text.substr(0, space);
  if (kind != "F" && kind != "B" && kind != "W" && kind != "BW") return false;
  auto number = [&](size_t& at, std::string_view prefix) {
    if (text.substr(at, prefix.size()) != prefix) return false;
    at += prefix.size();
    const size_t digits = at;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
    return at > digits;
  };
  size_t at = space;
  return number(at, " mb") && number(at, " s") && at == text.size();
}

bool is_pipeline_span(const TraceEntry& e) { return e.is_span() && is_pipeline_action(e.text); }
bool is_compute_span(const TraceEntry& e) { return e.is_span() && !is_pipeline_action(e.text); }

// The rank's spans that `pick` selects, in ring order, each given a lane (a track): within one
// lane spans nest or follow one another, as slices of one track must; a span that begins inside
// an open one and outlasts it (spans of two threads, or one group's backward ending just after
// the next one's began) goes to the first lane where it fits.
std::vector<int> span_lanes(const RankDump& d, bool (*pick)(const TraceEntry&)) {
  struct Span {
    int64_t begin, end;
    size_t index;  // among the rank's spans, in ring order
  };
  std::vector<Span> spans;
  for (const auto& e : d.entries) {
    if (!pick(e)) continue;
    const int64_t begin = e.started_ns != 0 ? e.started_ns : e.enqueued_ns;
    const int64_t end = e.finished() ? e.completed_ns : INT64_MAX;
    spans.push_back({begin, std::max(begin, end), spans.size()});
  }
  // Outer spans first: by begin, the longer of two that begin together first.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  });
  std::vector<std::vector<int64_t>> open;  // per lane: the ends of its enclosing spans
  std::vector<int> lane_of(spans.size(), 0);
  for (const Span& s : spans) {
    size_t lane = 0;
    for (; lane < open.size(); ++lane) {
      auto& ends = open[lane];
      while (!ends.empty() && ends.back() <= s.begin) ends.pop_back();
      if (ends.empty() || ends.back() >= s.end) break;
    }
    if (lane == open.size()) open.emplace_back();
    open[lane].push_back(s.end);
    lane_of[s.index] = static_cast<int>(lane);
  }
  return lane_of;
}

}  // namespace

std::string format_dump_table(const RankDump& d) {
  std::string out = fmt::format(
      "rank {} of {} on {} (pid {}), dump version {}\ntrigger {} (initiator {}){}\n"
      "{} of {} recorded entries kept (capacity {}), step {}\n",
      d.rank, d.world_size, d.hostname, d.pid, d.version, trigger_name(d.trigger), d.initiator,
      d.reason.empty() ? "" : ": " + d.reason, d.entries.size(), d.recorded, d.capacity, d.step);
  for (const auto& g : d.groups) {
    std::string ranks;
    for (size_t i = 0; i < g.ranks.size(); ++i)
      ranks += fmt::format("{}{}", i ? "," : "", g.ranks[i]);
    out += fmt::format("group {} '{}': ranks {}\n", g.id, g.name, ranks);
  }
  for (const auto& drop : d.dropped) {
    out += fmt::format("group {}: {} entries overwritten, last dropped seq {}\n", drop.group_id,
                       drop.dropped, drop.last_dropped_seq);
  }
  out += fmt::format(
      "\n{:>8} {:>10} {:>6} {:<14} {:>5} {:<10} {:<7} {:<16} {:>5} {:>12} {:>12}  {}\n", "record",
      "group", "seq", "op", "peer", "state", "reduce", "input", "step", "age", "duration", "text");
  for (const auto& e : d.entries) {
    const int64_t age = d.monotonic_ns - e.enqueued_ns;
    const std::string duration =
        e.completed_ns > 0 ? fmt::format("{:.3f}ms", (e.completed_ns - e.enqueued_ns) / 1e6) : "-";
    out += fmt::format(
        "{:>8} {:>10} {:>6} {:<14} {:>5} {:<10} {:<7} {:<16} {:>5} {:>11.3f}s {:>12}  {}\n",
        e.record_id, e.is_user_event() || e.is_span() ? "-" : group_label(d, e.group_id),
        e.is_p2p() ? e.p2p_seq : e.seq, op_name(e.op), e.peer, state_name(e.state),
        reduce_op_text(e.reduce_op), tensor_text(e.input), e.step, age / 1e9, duration, e.text);
  }
  return out;
}

std::string export_perfetto(const DumpSet& set) {
  using Json = nlohmann::json;
  Json events = Json::array();
  for (const auto& d : set.dumps) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", d.rank},
                      {"args", {{"name", fmt::format("rank {} ({})", d.rank, d.hostname)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", d.rank},
                      {"args", {{"sort_index", d.rank}}}});
    // Thread ids are small per-rank track numbers (Perfetto's JSON importer takes 32-bit ids;
    // group ids are 64-bit hashes): 0 for user markers, 1..P for the pipeline's action lanes,
    // then the compute lanes, then one per group in order of first use, each named and sorted
    // by id.
    auto name_track = [&](int tid, const std::string& name) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", d.rank},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
      events.push_back({{"ph", "M"},
                        {"name", "thread_sort_index"},
                        {"pid", d.rank},
                        {"tid", tid},
                        {"args", {{"sort_index", tid}}}});
    };
    auto slice = [&](const TraceEntry& e, const std::string& name, int tid, Json args) {
      const bool pending = !e.finished();
      // What ran: from the start (the device's, for device-timed entries) when there is one.
      const int64_t begin = d.to_wall_ns(e.started_ns != 0 ? e.started_ns : e.enqueued_ns);
      const int64_t end = pending ? d.wall_time_us * 1000 : d.to_wall_ns(e.completed_ns);
      args["state"] = state_name(e.state);
      args["step"] = e.step;
      args["record_id"] = e.record_id;
      events.push_back({{"ph", "X"},
                        {"name", name + (pending ? " (pending)" : "")},
                        {"cat", op_name(e.op)},
                        {"pid", d.rank},
                        {"tid", tid},
                        {"ts", static_cast<double>(begin) / 1000.0},
                        {"dur", static_cast<double>(std::max<int64_t>(end - begin, 0)) / 1000.0},
                        {"args", std::move(args)}});
    };
    auto lane_count = [](const std::vector<int>& lanes) {
      return lanes.empty() ? 0 : *std::max_element(lanes.begin(), lanes.end()) + 1;
    };
    const std::vector<int> actions = span_lanes(d, is_pipeline_span);
    const std::vector<int> lanes = span_lanes(d, is_compute_span);
    const int first_compute = 1 + lane_count(actions);
    for (int lane = 0; lane < lane_count(actions); ++lane) {
      name_track(1 + lane, lane == 0 ? "pipeline" : fmt::format("pipeline {}", lane + 1));
    }
    for (int lane = 0; lane < lane_count(lanes); ++lane) {
      name_track(first_compute + lane, lane == 0 ? "compute" : fmt::format("compute {}", lane + 1));
    }
    const int first_group = first_compute + lane_count(lanes);
    std::map<uint64_t, int> track;
    bool markers = false;
    size_t span = 0, action = 0;
    for (const auto& e : d.entries) {
      if (e.is_user_event()) {
        if (!markers) {
          markers = true;
          name_track(0, "markers");
        }
        events.push_back({{"ph", "i"},
                          {"s", "p"},
                          {"name", e.text},
                          {"pid", d.rank},
                          {"tid", 0},
                          {"ts", d.to_wall_ns(e.enqueued_ns) / 1000.0},
                          {"args", {{"step", e.step}}}});
        continue;
      }
      if (is_pipeline_span(e)) {
        slice(e, e.text, 1 + actions[action++], {{"thread_id", e.thread_id}});
        continue;
      }
      if (e.is_span()) {
        slice(e, e.text, first_compute + lanes[span++], {{"thread_id", e.thread_id}});
        continue;
      }
      auto [it, fresh] = track.emplace(e.group_id, first_group + static_cast<int>(track.size()));
      if (fresh) name_track(it->second, "group " + group_label(d, e.group_id));
      Json args = {
          {"seq", e.seq}, {"input", tensor_text(e.input)}, {"output", tensor_text(e.output)}};
      if (e.started_ns > e.enqueued_ns) {
        args["queued_ms"] = static_cast<double>(e.started_ns - e.enqueued_ns) / 1e6;
      }
      if (e.is_p2p()) {
        args["peer"] = e.peer;
        args["p2p_seq"] = e.p2p_seq;
      }
      if (e.op == OpType::kAllReduce || e.op == OpType::kReduceScatter) {
        args["reduce_op"] = reduce_op_text(e.reduce_op);
      }
      if (e.op == OpType::kBroadcast) args["root"] = e.root;
      slice(e, entry_name(d, e), it->second, std::move(args));
    }
  }
  Json j = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return j.dump() + "\n";
}

}  // namespace tessel::fr
