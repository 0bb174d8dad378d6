#include "tessel/flight_recorder/internal/pytorch_timeouts.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace tessel::fr::internal {
namespace {

// PyTorch numbers a rank's entries from 0 (read as record 1): a dump whose oldest entry is that
// one holds everything the rank recorded.
bool holds_whole_history(const RankDump& d) {
  return d.entries.empty() || d.entries.front().record_id == 1;
}

void read_back_as_waiting(TraceEntry& e) {
  e.state = EntryState::kStarted;
  e.started_ns = 0;
  e.completed_ns = 0;
}

}  // namespace

size_t reconcile_pytorch_timeouts(std::vector<RankDump>& dumps) {
  if (dumps.empty()) return 0;
  std::map<int, const RankDump*> by_rank;
  for (const auto& d : dumps) by_rank[d.rank] = &d;
  std::map<uint64_t, const GroupInfo*> groups;  // settled: every dump lists the same groups
  for (const auto& g : dumps.front().groups) groups[g.id] = &g;

  // Per rank and group: the newest collective seq issued; per group, sender, receiver and
  // direction: how many sends (receives) the rank posted.
  std::map<std::pair<int, uint64_t>, uint64_t> reached;
  std::map<std::tuple<uint64_t, int, int, OpType>, uint64_t> posted;
  for (const auto& d : dumps) {
    for (const auto& e : d.entries) {
      if (e.is_collective()) {
        auto& r = reached[{d.rank, e.group_id}];
        r = std::max(r, e.seq);
      } else if (e.is_p2p() && e.peer >= 0) {
        const auto g = groups.find(e.group_id);
        if (g == groups.end() || static_cast<size_t>(e.peer) >= g->second->ranks.size()) continue;
        auto& n = posted[{e.group_id, d.rank, g->second->ranks[e.peer], e.op}];
        n = std::max(n, e.p2p_seq);
      }
    }
  }
  // The lowest seq of `group` that a member with a trustworthy dump issued (UINT64_MAX: none).
  std::map<uint64_t, uint64_t> floor;
  for (const auto& [id, g] : groups) {
    uint64_t low = UINT64_MAX;
    for (int r : g->ranks) {
      const auto d = by_rank.find(r);
      if (d == by_rank.end()) continue;
      const auto it = reached.find({r, id});
      if (it != reached.end()) {
        low = std::min(low, it->second);
      } else if (holds_whole_history(*d->second)) {
        low = 0;
      }
    }
    floor[id] = low;
  }

  size_t read_back = 0;
  for (auto& d : dumps) {
    bool changed = false;
    for (auto& e : d.entries) {
      if (e.state != EntryState::kCompleted) continue;
      const auto g = groups.find(e.group_id);
      if (g == groups.end()) continue;
      bool disproved = false;
      if (e.is_collective()) {
        disproved = e.seq > floor[e.group_id];
      } else if (e.is_p2p() && e.peer >= 0 &&
                 static_cast<size_t>(e.peer) < g->second->ranks.size()) {
        const auto& ranks = g->second->ranks;
        const int peer = ranks[e.peer];
        const auto p = by_rank.find(peer);
        const auto self = std::find(ranks.begin(), ranks.end(), d.rank);
        if (p != by_rank.end() && self != ranks.end() && holds_whole_history(d) &&
            holds_whole_history(*p->second)) {
          const OpType other = e.op == OpType::kSend ? OpType::kRecv : OpType::kSend;
          const auto n = posted.find({e.group_id, peer, d.rank, other});
          disproved = (n == posted.end() ? 0 : n->second) < e.p2p_seq;
        }
      }
      if (!disproved) continue;
      read_back_as_waiting(e);
      changed = true;
      ++read_back;
    }
    if (!changed) continue;
    int64_t newest = 0;
    for (const auto& e : d.entries)
      newest = std::max({newest, e.enqueued_ns, e.started_ns, e.completed_ns});
    d.monotonic_ns = newest;
    d.wall_time_us = newest / 1000;
  }
  return read_back;
}

}  // namespace tessel::fr::internal
