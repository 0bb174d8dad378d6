#include "tessel/flight_recorder/internal/analysis_model.h"

#include <algorithm>
#include <functional>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"

namespace tessel::fr::internal {

Model::Model(const DumpSet& set, const AnalyzerOptions& options) : set_(set), options_(options) {
  world_size_ = std::max(set.world_size, 0);
  for (const auto& d : set.dumps) world_size_ = std::max(world_size_, d.rank + 1);
  by_rank_.assign(world_size_, nullptr);
  stale_.assign(world_size_, false);
  reached_.resize(world_size_);
  dropped_.resize(world_size_);
  bool timed_out = false;
  for (const auto& d : set.dumps) {
    by_rank_[d.rank] = &d;
    newest_wall_us_ = std::max(newest_wall_us_, d.wall_time_us);
    timed_out |= d.trigger == DumpTrigger::kTimeout;
  }
  // A watchdog timeout already says the job hangs; otherwise young pending ops are in flight.
  threshold_ns_ = timed_out ? 0 : options.min_wait.count();
  const int64_t stale_us = options.stale_after.count() / 1000;
  for (const auto& d : set.dumps) {
    stale_[d.rank] = newest_wall_us_ - d.wall_time_us > stale_us;
    index_dump(d);
  }
  for (const auto& d : set.dumps) {
    if (!stale_[d.rank]) find_wait(d);
  }
  for (const auto& [key, ranks] : failed_) {
    const auto& [group, seq, op] = key;
    notes_.push_back(fmt::format("{} #{} of group '{}' failed on {} {} (see their logs)", op, seq,
                                 group_name(group), ranks.size() == 1 ? "rank" : "ranks",
                                 format_rank_list(ranks)));
  }
}

void Model::index_dump(const RankDump& d) {
  for (const auto& g : d.groups) groups_.emplace(g.id, &g);
  for (const auto& drop : d.dropped) {
    dropped_[d.rank][drop.group_id] = drop.dropped;
    auto& r = reached_[d.rank][drop.group_id];
    r = std::max(r, drop.last_dropped_seq);
  }
  for (const auto& e : d.entries) {
    if (e.state == EntryState::kFailed) {
      failed_[{e.group_id, e.is_p2p() ? e.p2p_seq : e.seq, std::string(op_name(e.op))}].push_back(
          d.rank);
    }
    if (e.is_collective()) {
      auto& r = reached_[d.rank][e.group_id];
      r = std::max(r, e.seq);
      aligned_[e.group_id][{e.seq, e.coalesced_index}].emplace_back(d.rank, &e);
    } else if (e.is_p2p()) {
      const auto it = groups_.find(e.group_id);
      if (it == groups_.end() || e.peer < 0 ||
          static_cast<size_t>(e.peer) >= it->second->ranks.size()) {
        continue;  // reported when the entry matters (find_wait)
      }
      const int peer = it->second->ranks[e.peer];
      const bool send = e.op == OpType::kSend;
      posted_.insert({e.group_id, send ? d.rank : peer, send ? peer : d.rank, e.p2p_seq, send});
    }
  }
}

uint64_t Model::reached(int rank, uint64_t group) const {
  const auto& m = reached_[rank];
  const auto it = m.find(group);
  return it == m.end() ? 0 : it->second;
}

void Model::find_wait(const RankDump& d) {
  const TraceEntry* blocking = nullptr;
  for (const auto& e : d.entries) {
    if (!e.finished() && !e.is_user_event() && d.monotonic_ns - e.enqueued_ns >= threshold_ns_) {
      blocking = &e;
      break;
    }
  }
  if (blocking == nullptr) {
    // A rank whose last operation failed (its timeout fired, or a peer was lost) was blocked in
    // it until then: that operation is where it waited, however long ago it ended.
    for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it) {
      if (it->is_user_event()) continue;
      if (it->state == EntryState::kFailed) blocking = &*it;
      break;
    }
  }
  if (blocking == nullptr) return;
  const auto git = groups_.find(blocking->group_id);
  if (git == groups_.end()) {
    notes_.push_back(
        fmt::format("rank {} waits in {} #{} of group {}, which no dump registers; "
                    "its members are unknown",
                    d.rank, op_name(blocking->op), blocking->seq, blocking->group_id));
    return;
  }
  const GroupInfo& g = *git->second;
  Wait w;
  w.entry = blocking;
  w.op.group = g.id;
  if (blocking->is_collective()) {
    w.op.seq = blocking->seq;
    for (int s : g.ranks) {
      if (s == d.rank || s >= world_size_) continue;
      if (dump_of(s) == nullptr || reached(s, g.id) < blocking->seq) w.missing.push_back(s);
    }
  } else {
    if (blocking->peer < 0 || static_cast<size_t>(blocking->peer) >= g.ranks.size()) {
      notes_.push_back(fmt::format("rank {}: {} #{} names peer {} outside group '{}' of {} ranks",
                                   d.rank, op_name(blocking->op), blocking->p2p_seq, blocking->peer,
                                   g.name, g.ranks.size()));
      return;
    }
    const int peer = g.ranks[blocking->peer];
    const bool send = blocking->op == OpType::kSend;
    w.op.p2p = true;
    w.op.seq = blocking->p2p_seq;
    w.op.src = send ? d.rank : peer;
    w.op.dst = send ? peer : d.rank;
    if (!posted_.count({g.id, w.op.src, w.op.dst, w.op.seq, !send})) {
      w.missing.push_back(peer);
      const RankDump* p = dump_of(peer);
      if (p != nullptr) {
        const auto dit = dropped_[peer].find(g.id);
        const bool lost = dit != dropped_[peer].end() && dit->second > 0;
        const int64_t oldest =
            p->entries.empty() ? INT64_MAX : p->to_wall_ns(p->entries.front().enqueued_ns);
        w.unknown = lost && oldest > d.to_wall_ns(blocking->enqueued_ns);
      }
    }
  }
  std::sort(w.missing.begin(), w.missing.end());
  waits_[d.rank] = std::move(w);
}

RankPosition Model::position(int rank) const {
  RankPosition p;
  p.rank = rank;
  const RankDump* d = dump_of(rank);
  if (d == nullptr) {
    p.where = RankPosition::Where::kNoDump;
    p.summary = p.place = "no dump (killed, stopped, or unable to write one)";
    return p;
  }
  p.step = d->step;
  const TraceEntry* last_done = nullptr;
  for (const auto& e : d->entries) {
    if (e.is_user_event()) p.last_event = e.text;
    if (!e.is_user_event() && e.finished()) last_done = &e;
  }
  std::string where, place;
  const auto it = waits_.find(rank);
  if (it != waits_.end()) {
    const Wait& w = it->second;
    const std::string op =
        w.op.p2p ? describe_p2p(w.op) : describe_collective(w.op.group, w.op.seq, *w.entry);
    if (w.entry->state == EntryState::kFailed) {
      place = fmt::format("stuck in {} until it failed", op);
      where = fmt::format("{} after {}", place,
                          format_duration(Nanoseconds(w.entry->completed_ns - w.entry->enqueued_ns)));
    } else {
      place = fmt::format("waiting in {}", op);
      where = fmt::format("{} for {}", place,
                          format_duration(Nanoseconds(d->monotonic_ns - w.entry->enqueued_ns)));
    }
    p.where = RankPosition::Where::kInOperation;
  } else if (last_done != nullptr) {
    const std::string op =
        last_done->is_p2p() ? fmt::format("{} #{} (group '{}')", op_name(last_done->op),
                                          last_done->p2p_seq, group_name(last_done->group_id))
                            : describe_collective(last_done->group_id, last_done->seq, *last_done);
    place = fmt::format("in compute since {} {}", op, state_name(last_done->state));
    where = fmt::format("in compute for {} since {} {}",
                        format_duration(Nanoseconds(d->monotonic_ns - last_done->completed_ns)), op,
                        state_name(last_done->state));
    p.where = RankPosition::Where::kInCompute;
  } else {
    where = place = "in compute; no finished operation in its dump";
    p.where = RankPosition::Where::kInCompute;
  }
  if (stale_[rank]) {
    p.where = RankPosition::Where::kStale;
    p.summary = fmt::format(
        "stale dump, written {} before the newest (stopped or unresponsive); it was then {}",
        format_duration(Nanoseconds((newest_wall_us_ - d->wall_time_us) * 1000)), where);
    p.place = "stale dump; it was then " + place;
  } else {
    p.summary = where;
    p.place = place;
  }
  return p;
}

std::vector<std::vector<int>> Model::wait_cycles() const {
  // Tarjan's strongly connected components over ranks that wait; edges to the ranks they miss.
  std::map<int, int> index, low;
  std::vector<int> stack;
  std::set<int> on_stack;
  std::vector<std::vector<int>> out;
  int counter = 0;
  std::function<void(int)> visit = [&](int v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    on_stack.insert(v);
    for (int s : waits_.at(v).missing) {
      if (!waits_.count(s)) continue;
      if (!index.count(s)) {
        visit(s);
        low[v] = std::min(low[v], low[s]);
      } else if (on_stack.count(s)) {
        low[v] = std::min(low[v], index[s]);
      }
    }
    if (low[v] == index[v]) {
      std::vector<int> comp;
      int s;
      do {
        s = stack.back();
        stack.pop_back();
        on_stack.erase(s);
        comp.push_back(s);
      } while (s != v);
      if (comp.size() > 1) {
        std::sort(comp.begin(), comp.end());
        out.push_back(std::move(comp));
      }
    }
  };
  for (const auto& [rank, w] : waits_) {
    if (!index.count(rank)) visit(rank);
  }
  return out;
}

std::vector<int> Model::issued(uint64_t group, uint64_t seq) const {
  std::vector<int> out;
  const auto it = groups_.find(group);
  if (it == groups_.end()) return out;
  for (int s : it->second->ranks) {
    if (dump_of(s) != nullptr && reached(s, group) >= seq) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Model::waiting_in(const Op& op) const {
  std::vector<int> out;
  for (const auto& [rank, w] : waits_) {
    if (w.op == op) out.push_back(rank);
  }
  return out;
}

bool Model::waited_on(int rank) const {
  return std::any_of(waits_.begin(), waits_.end(), [&](const auto& kv) {
    return std::binary_search(kv.second.missing.begin(), kv.second.missing.end(), rank);
  });
}

std::vector<StragglerStats> Model::stragglers() const {
  // A collective counts when one rank arrived clearly last: at least straggler_min_lag after
  // the next latest. Ties (ranks released together by an earlier collective) count for nobody.
  const int64_t min_lag = options_.straggler_min_lag.count();
  std::vector<size_t> samples(world_size_, 0), last(world_size_, 0);
  std::vector<std::vector<int64_t>> lags(world_size_);
  std::vector<std::pair<int64_t, int>> arrivals;
  for (const auto& [group, by_seq] : aligned_) {
    const auto git = groups_.find(group);
    if (git == groups_.end() || git->second->ranks.size() < 2) continue;
    for (const auto& [key, members] : by_seq) {
      if (members.size() != git->second->ranks.size()) continue;
      arrivals.clear();
      for (const auto& [rank, e] : members) {
        arrivals.emplace_back(by_rank_[rank]->to_wall_ns(e->enqueued_ns), rank);
      }
      std::sort(arrivals.begin(), arrivals.end());
      const int64_t gap = arrivals.back().first - arrivals[arrivals.size() - 2].first;
      if (gap < min_lag) continue;
      for (const auto& a : arrivals) ++samples[a.second];
      ++last[arrivals.back().second];
      lags[arrivals.back().second].push_back(gap);
    }
  }
  std::vector<StragglerStats> out;
  for (int r = 0; r < world_size_; ++r) {
    if (last[r] < options_.straggler_min_samples) continue;
    if (static_cast<double>(last[r]) < options_.straggler_fraction * samples[r]) continue;
    auto& l = lags[r];
    std::nth_element(l.begin(), l.begin() + l.size() / 2, l.end());
    out.push_back({r, samples[r], last[r], l[l.size() / 2]});
  }
  return out;
}

std::string Model::group_name(uint64_t group) const {
  const auto it = groups_.find(group);
  return it == groups_.end() ? fmt::format("#{}", group) : it->second->name;
}

std::string Model::describe_collective(uint64_t group, uint64_t seq, const TraceEntry& e) const {
  std::string args;
  if (e.input.dtype[0] != '\0') {
    args = fmt::format(", {}[{}]", e.input.dtype, e.input.numel);
  }
  if (e.op == OpType::kAllReduce || e.op == OpType::kReduceScatter) {
    args += fmt::format(", {}", reduce_op_text(e.reduce_op));
  }
  if (e.op == OpType::kBroadcast) args += fmt::format(", root {}", e.root);
  return fmt::format("{} #{} of group '{}' ({}{})", op_name(e.op), seq, group_name(group),
                     e.step >= 0 ? fmt::format("step {}", e.step) : "no step", args);
}

std::string Model::describe_p2p(const Op& op) const {
  return fmt::format("send #{} from rank {} to rank {} in group '{}'", op.seq, op.src, op.dst,
                     group_name(op.group));
}

}  // namespace tessel::fr::internal
