#include "tessel/flight_recorder/export.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

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
  if (e.is_user_event()) return e.text;
  if (e.is_p2p()) {
    return fmt::format("{} #{} peer {} ({})", op_name(e.op), e.p2p_seq, e.peer,
                       group_label(d, e.group_id));
  }
  return fmt::format("{} #{} ({})", op_name(e.op), e.seq, group_label(d, e.group_id));
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
        e.record_id, e.is_user_event() ? "-" : group_label(d, e.group_id),
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
    // group ids are 64-bit hashes): 0 for user markers, then 1, 2, ... per group in order of
    // first use, each named.
    std::map<uint64_t, int> track;
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
    bool markers = false;
    for (const auto& e : d.entries) {
      const double ts = d.to_wall_ns(e.enqueued_ns) / 1000.0;
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
                          {"ts", ts},
                          {"args", {{"step", e.step}}}});
        continue;
      }
      auto [it, fresh] = track.emplace(e.group_id, static_cast<int>(track.size()) + 1);
      if (fresh) name_track(it->second, "group " + group_label(d, e.group_id));
      const bool pending = !e.finished();
      const int64_t end_ns = pending ? d.wall_time_us * 1000 : d.to_wall_ns(e.completed_ns);
      Json args = {{"state", state_name(e.state)},
                   {"seq", e.seq},
                   {"step", e.step},
                   {"input", tensor_text(e.input)},
                   {"output", tensor_text(e.output)},
                   {"record_id", e.record_id}};
      if (e.is_p2p()) {
        args["peer"] = e.peer;
        args["p2p_seq"] = e.p2p_seq;
      }
      if (e.op == OpType::kAllReduce || e.op == OpType::kReduceScatter) {
        args["reduce_op"] = reduce_op_text(e.reduce_op);
      }
      if (e.op == OpType::kBroadcast) args["root"] = e.root;
      events.push_back({{"ph", "X"},
                        {"name", entry_name(d, e) + (pending ? " (pending)" : "")},
                        {"cat", op_name(e.op)},
                        {"pid", d.rank},
                        {"tid", it->second},
                        {"ts", ts},
                        {"dur", std::max<int64_t>(end_ns / 1000 - static_cast<int64_t>(ts), 0)},
                        {"args", args}});
    }
  }
  Json j = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return j.dump() + "\n";
}

}  // namespace tessel::fr
