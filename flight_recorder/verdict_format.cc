// Verdict output: the human-readable report and the JSON form.
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "tessel/flight_recorder/analyzer.h"

namespace tessel::fr {

std::string format_verdict(const Verdict& v) {
  std::string out;
  switch (v.status) {
    case VerdictStatus::kCulpritFound:
      out += fmt::format("verdict: CULPRIT FOUND: {} {}\n",
                         v.culprits.size() == 1 ? "rank" : "ranks", format_rank_list(v.culprits));
      break;
    case VerdictStatus::kHealthy:
      out += "verdict: HEALTHY: no rank hangs, nothing mismatched\n";
      break;
    case VerdictStatus::kInconclusive:
      out += "verdict: INCONCLUSIVE\n";
      break;
  }
  out += fmt::format("  {} dumps for a world of {} ranks\n", v.dumps, v.world_size);
  for (size_t i = 0; i < v.findings.size(); ++i) {
    const Finding& f = v.findings[i];
    out += fmt::format("\n{}. [{}] {}\n", i + 1, finding_kind_name(f.kind), f.summary);
    for (const auto& d : f.details) out += fmt::format("     - {}\n", d);
  }
  if (!v.inconclusive.empty()) {
    out += "\nnot enough evidence:\n";
    for (const auto& r : v.inconclusive) out += fmt::format("  - {}\n", r);
    if (!v.suspects.empty()) {
      out += fmt::format("  suspects (one side of the above deviated; not blamed): {} {}\n",
                         v.suspects.size() == 1 ? "rank" : "ranks", format_rank_list(v.suspects));
    }
  }
  if (!v.stragglers.empty()) {
    out += "\ninformation (not a fault):\n";
    for (const auto& s : v.stragglers) out += fmt::format("  - straggler: {}\n", s.summary);
  }
  if (!v.notes.empty()) {
    out += "\nnotes:\n";
    for (const auto& n : v.notes) out += fmt::format("  - {}\n", n);
  }
  // Ranks in the same place folded together, in order of their lowest rank.
  std::vector<std::pair<std::string, std::vector<int>>> places;
  std::map<std::string, size_t> index;
  for (const auto& p : v.positions) {
    const std::string key =
        p.place + (p.last_event.empty() ? "" : "; last marked '" + p.last_event + "'");
    auto [it, fresh] = index.emplace(key, places.size());
    if (fresh) places.push_back({key, {}});
    places[it->second].second.push_back(p.rank);
  }
  out += "\nwhere the ranks are:\n";
  for (const auto& [place, ranks] : places) {
    out += fmt::format("  {} {}: {}\n", ranks.size() == 1 ? "rank" : "ranks",
                       format_rank_list(ranks), place);
  }
  return out;
}

std::string verdict_to_json(const Verdict& v) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["status"] = verdict_status_name(v.status);
  j["culprits"] = v.culprits;
  j["world_size"] = v.world_size;
  j["dumps"] = v.dumps;
  j["findings"] = Json::array();
  for (const auto& f : v.findings) {
    j["findings"].push_back({{"kind", finding_kind_name(f.kind)},
                             {"culprits", f.culprits},
                             {"waiting", f.waiting},
                             {"group_id", f.group_id},
                             {"group_name", f.group_name},
                             {"seq", f.seq},
                             {"summary", f.summary},
                             {"details", f.details}});
  }
  j["inconclusive"] = v.inconclusive;
  j["suspects"] = v.suspects;
  j["stragglers"] = Json::array();
  for (const auto& s : v.stragglers) {
    j["stragglers"].push_back({{"rank", s.rank},
                               {"late", s.late},
                               {"samples", s.samples},
                               {"median_lag_ns", s.median_lag.count()},
                               {"median_duration_ns", s.median_duration.count()},
                               {"summary", s.summary}});
  }
  j["notes"] = v.notes;
  j["positions"] = Json::array();
  for (const auto& p : v.positions) {
    j["positions"].push_back({{"rank", p.rank},
                              {"where", where_name(p.where)},
                              {"summary", p.summary},
                              {"last_event", p.last_event},
                              {"step", p.step}});
  }
  return j.dump(2) + "\n";
}

}  // namespace tessel::fr
