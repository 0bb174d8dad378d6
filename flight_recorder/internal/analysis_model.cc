#include "tessel/flight_recorder/internal/analysis_model.h"

#include <string.h>

#include <algorithm>
#include <functional>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"

namespace tessel::fr::internal {
namespace {

// A dump of a process that died: written by its fatal-signal handler, or recovered afterwards
// from its ring file (the launcher does so for a worker killed without a dump, e.g. SIGKILL;
// its reason is then "signal <N> ...").
bool left_at_death(DumpTrigger t) {
  return t == DumpTrigger::kFatalSignal || t == DumpTrigger::kRecovered;
}

}  // namespace

namespace {

// The newest failed operation of a ring that no completed operation follows: what the rank was
// left with when an operation of its own failed (null when none).
const HeldEntry* last_failure(const std::vector<HeldEntry>& held) {
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (it->state == EntryState::kCompleted) return nullptr;
    if (it->state == EntryState::kFailed) return &*it;
  }
  return nullptr;
}

// The oldest failed operation after the rank's last completed one: where its progress stopped.
// Operations issued behind it (an FSDP prefetch, the next async call) fail only as consequences.
const HeldEntry* first_failure(const std::vector<HeldEntry>& held) {
  const HeldEntry* first = nullptr;
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (it->state == EntryState::kCompleted) break;
    if (it->state == EntryState::kFailed) first = &*it;
  }
  return first;
}

}  // namespace

Model::Model(const Digest& digest, const AnalyzerOptions& options)
    : digest_(digest), options_(options) {
  const DumpSet& set = digest.set();
  world_size_ = std::max(set.world_size, 0);
  for (const auto& d : set.dumps) world_size_ = std::max(world_size_, d.rank + 1);
  by_rank_.assign(world_size_, Dump{});
  stale_.assign(world_size_, false);
  reached_.resize(world_size_);
  dropped_.resize(world_size_);
  for (const auto& e : set.exits) {
    if (e.rank >= 0 && e.rank < world_size_) exits_[e.rank] = &e;
  }
  bool timed_out = false;
  for (size_t i = 0; i < set.dumps.size(); ++i) {
    const RankDump& d = set.dumps[i];
    by_rank_[d.rank] = {i, &d, &digest.rank_digest(i)};
    newest_wall_us_ = std::max(newest_wall_us_, d.wall_time_us);
    // PyTorch's dumps (version 0 here) carry no time of their own: "now" is their newest
    // stamp, so they are taken as dumps of a hung job.
    timed_out |= d.trigger == DumpTrigger::kTimeout || d.version == 0;
  }
  // A watchdog timeout already says the job hangs; otherwise young pending ops are in flight.
  threshold_ns_ = timed_out ? 0 : options.min_wait.count();
  const int64_t stale_us = options.stale_after.count() / 1000;
  for (const auto& d : set.dumps) {
    // A rank that died, or gave up on an operation, told its last state; only a rank that may
    // have gone on since its dump (it stopped answering) leaves a stale one.
    const bool final =
        left_at_death(d.trigger) || last_failure(by_rank_[d.rank].digest->held) != nullptr;
    stale_[d.rank] = !final && newest_wall_us_ - d.wall_time_us > stale_us;
    index_dump(by_rank_[d.rank]);
  }
  for (const auto& [id, g] : groups_) {
    families_[family_of(id)].push_back(id);
  }
  for (const auto& d : set.dumps) {
    if (stale_[d.rank] || (left_at_death(d.trigger) && !aborted_after_failure(d.rank))) continue;
    find_wait(by_rank_[d.rank]);
  }
  find_late_arrivals();
  find_deviations();
  for (const auto& [key, ranks] : failed_) {
    const auto& [group, seq, op] = key;
    notes_.push_back(fmt::format("{} #{} of group '{}' failed on {} {} (see their logs)", op, seq,
                                 group_name(group), ranks.size() == 1 ? "rank" : "ranks",
                                 format_rank_list(ranks)));
  }
}

void Model::index_dump(const Dump& d) {
  const int rank = d.header->rank;
  for (const GroupInfo* g : d.digest->registered) groups_.emplace(g->id, g);
  for (const auto& drop : d.header->dropped) {
    dropped_[rank][drop.group_id] = drop.dropped;
    auto& r = reached_[rank][drop.group_id];
    r = std::max(r, drop.last_dropped_seq);
  }
  for (const auto& f : d.digest->failed) {
    failed_[{f.group, f.seq, std::string(op_name(f.op))}].push_back(rank);
  }
  for (const auto& h : d.digest->groups) {
    if (!h.collectives) continue;
    auto& r = reached_[rank][h.group];
    r = std::max(r, h.reached);
  }
  for (const auto& run : d.digest->p2p) {
    const auto it = groups_.find(run.group);
    if (it == groups_.end() || run.peer < 0 ||
        static_cast<size_t>(run.peer) >= it->second->ranks.size()) {
      continue;  // reported when the entry matters (find_wait)
    }
    const int peer = it->second->ranks[run.peer];
    posted_[{run.group, run.send ? rank : peer, run.send ? peer : rank, run.send}].emplace_back(
        run.first, run.last);
  }
}

uint64_t Model::reached(int rank, uint64_t group) const {
  const auto& m = reached_[rank];
  const auto it = m.find(group);
  return it == m.end() ? 0 : it->second;
}

std::string Model::family_of(uint64_t group) const {
  const auto it = groups_.find(group);
  if (it == groups_.end()) return fmt::format("#{}", group);
  return fmt::format("{}\x1f{}", it->second->name, it->second->ranks.size());
}

bool Model::member_of(int rank, uint64_t group) const {
  const auto it = groups_.find(group);
  if (it == groups_.end()) return false;
  const auto& r = it->second->ranks;
  return std::find(r.begin(), r.end(), rank) != r.end();
}

bool Model::crashed(int rank) const {
  const Dump* d = dump_of(rank);
  return d != nullptr && left_at_death(d->header->trigger) && !exited_with_ring(rank) &&
         last_failure(d->digest->held) == nullptr;
}

bool Model::exited_with_ring(int rank) const {
  const Dump* d = dump_of(rank);
  if (d == nullptr || d->header->trigger != DumpTrigger::kRecovered) return false;
  const auto it = exits_.find(rank);
  return it != exits_.end() && it->second->signal == 0;
}

bool Model::aborted_after_failure(int rank) const {
  const Dump* d = dump_of(rank);
  return d != nullptr && left_at_death(d->header->trigger) &&
         last_failure(d->digest->held) != nullptr;
}

bool Model::exited_cleanly(int rank) const {
  if (dump_of(rank) != nullptr && !exited_with_ring(rank)) return false;
  const auto it = exits_.find(rank);
  return it != exits_.end() && it->second->signal == 0 && it->second->exit_code == 0;
}

bool Model::dead(int rank) const {
  if (rank < 0 || rank >= world_size_) return false;
  return ((dump_of(rank) == nullptr || exited_with_ring(rank)) && !exited_cleanly(rank)) ||
         crashed(rank) || stale_[rank];
}

namespace {

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev == nullptr ? fmt::format("signal {}", sig) : fmt::format("SIG{}", abbrev);
}

}  // namespace

std::string Model::death(int rank) const {
  if ((crashed(rank) || aborted_after_failure(rank)) && !exited_with_ring(rank)) {
    const RankDump* d = dump_of(rank)->header;
    int sig = 0;
    if (d->reason.rfind("signal ", 0) == 0) sig = std::atoi(d->reason.c_str() + 7);
    return sig > 0 ? fmt::format("crashed ({})", signal_text(sig))
                   : fmt::format("crashed ({})", d->reason);
  }
  const auto it = exits_.find(rank);
  if (it != exits_.end()) {
    return it->second->signal != 0 ? fmt::format("killed by {}", signal_text(it->second->signal))
                                   : fmt::format("exited with status {}", it->second->exit_code);
  }
  return "no dump (killed, stopped, or unable to write one)";
}

const HeldEntry* Model::crash_op(int rank) const {
  if (!crashed(rank)) return nullptr;
  for (const auto& e : dump_of(rank)->digest->held) {
    if (!e.finished()) return &e;
  }
  return nullptr;
}

bool Model::needs_gone_rank(int rank, const HeldEntry& e) const {
  const auto git = groups_.find(e.group_id);
  if (git == groups_.end()) return false;
  const GroupInfo& g = *git->second;
  auto gone = [&](int s) {
    return s != rank && s >= 0 && s < world_size_ &&
           (crashed(s) || exited_with_ring(s) || (dump_of(s) == nullptr && exits_.count(s) > 0));
  };
  if (!e.is_collective()) {
    return e.peer >= 0 && static_cast<size_t>(e.peer) < g.ranks.size() && gone(g.ranks[e.peer]);
  }
  for (int s : g.ranks) {
    if (!gone(s)) continue;
    if (dump_of(s) == nullptr || reached(s, g.id) < e.seq) return true;
    const HeldEntry* in = crash_op(s);  // it crashed inside this very collective
    if (in != nullptr && in->group_id == e.group_id && in->seq == e.seq) return true;
  }
  return false;
}

void Model::find_wait(const Dump& dump) {
  const RankDump& d = *dump.header;
  const auto& held = dump.digest->held;
  const HeldEntry* blocking = nullptr;
  for (const auto& e : held) {
    if (e.finished()) continue;
    // A young operation is in flight, not waiting, unless a rank it needs is gone (a launcher
    // asks for dumps as soon as a rank dies, before the others have noticed).
    if (d.monotonic_ns - e.enqueued_ns >= threshold_ns_ || needs_gone_rank(d.rank, e)) {
      blocking = &e;
      break;
    }
  }
  if (blocking == nullptr) {
    // A rank whose operations failed (its timeout fired, or a peer was lost) was blocked in the
    // first of them until then: that operation is where it waited, however long ago it ended,
    // and whatever it queued behind it.
    blocking = first_failure(held);
  }
  if (left_at_death(d.trigger)) {
    // It died of a signal because that failure went unhandled: the failed operation is where it
    // waited, whatever its ring recorded after (operations queued behind it).
    blocking = first_failure(held);
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
    const auto runs = posted_.find({g.id, w.op.src, w.op.dst, !send});
    const bool posted = runs != posted_.end() &&
                        std::any_of(runs->second.begin(), runs->second.end(), [&](const auto& r) {
                          return r.first <= w.op.seq && w.op.seq <= r.second;
                        });
    if (!posted) {
      w.missing.push_back(peer);
      const Dump* p = dump_of(peer);
      if (p != nullptr) {
        const auto dit = dropped_[peer].find(g.id);
        const bool lost = dit != dropped_[peer].end() && dit->second > 0;
        const int64_t oldest = p->digest->entries == 0
                                   ? INT64_MAX
                                   : p->header->to_wall_ns(p->digest->oldest_enqueued_ns);
        w.unknown = lost && oldest > d.to_wall_ns(blocking->enqueued_ns);
      }
    }
  }
  std::sort(w.missing.begin(), w.missing.end());
  waits_[d.rank] = std::move(w);
}

void Model::find_late_arrivals() {
  // Clocks of different hosts may disagree by this much: an arrival within it of another
  // member's giving up is not called late.
  constexpr int64_t kClockSlackNs = 50'000'000;
  const int64_t min_wait = std::max<int64_t>(options_.min_wait.count(), 100'000'000);
  std::map<Op, std::vector<int>> by_op;
  for (const auto& [rank, w] : waits_) {
    if (!w.op.p2p) by_op[w.op].push_back(rank);
  }
  auto wall = [&](int rank, int64_t ns) { return dump_of(rank)->header->to_wall_ns(ns); };
  for (const auto& [op, ranks] : by_op) {
    // The first member to give up after a real wait (not one that failed at once because a peer
    // was lost), then every member that issued the collective after that moment.
    int64_t first_gave_up = INT64_MAX;
    std::vector<int> gave_up;
    for (int r : ranks) {
      const HeldEntry& e = *waits_.at(r).entry;
      if (e.state != EntryState::kFailed || e.completed_ns - e.enqueued_ns < min_wait) continue;
      gave_up.push_back(r);
      first_gave_up = std::min(first_gave_up, wall(r, e.completed_ns));
    }
    if (gave_up.empty()) continue;
    std::vector<int> late;
    for (int r : ranks) {
      if (wall(r, waits_.at(r).entry->enqueued_ns) > first_gave_up + kClockSlackNs)
        late.push_back(r);
    }
    // A member that came in time but failed long after the others gave up, having waited far
    // longer than they did, stopped inside the collective (a stopped or descheduled process: its
    // own timeout could not fire while it was not running).
    std::vector<int64_t> waited;
    for (int r : gave_up) {
      const HeldEntry& e = *waits_.at(r).entry;
      waited.push_back(e.completed_ns - e.enqueued_ns);
    }
    std::sort(waited.begin(), waited.end());
    const int64_t usual = waited[waited.size() / 2];
    std::vector<int> stalled;
    for (int r : ranks) {
      const HeldEntry& e = *waits_.at(r).entry;
      if (std::find(late.begin(), late.end(), r) != late.end() || e.state != EntryState::kFailed) {
        continue;
      }
      const int64_t wait = e.completed_ns - e.enqueued_ns;
      if (wall(r, e.completed_ns) > first_gave_up + std::max(min_wait, kClockSlackNs) &&
          2 * wait > 3 * usual) {
        stalled.push_back(r);
      }
    }
    if (late.size() + stalled.size() == 0 || late.size() + stalled.size() == ranks.size()) continue;
    auto record = [&](int r, bool in_it) {
      const HeldEntry* e = waits_.at(r).entry;
      std::vector<int> before;
      for (int g : gave_up) {
        if (std::find(late.begin(), late.end(), g) == late.end() &&
            std::find(stalled.begin(), stalled.end(), g) == stalled.end()) {
          before.push_back(g);
        }
      }
      const int64_t at = wall(r, in_it ? e->completed_ns : e->enqueued_ns);
      late_[r] = {op, e, before, at - first_gave_up, in_it};
      waits_.erase(r);
    };
    for (int r : late) record(r, false);
    for (int r : stalled) record(r, true);
    late.insert(late.end(), stalled.begin(), stalled.end());
    for (int r : ranks) {
      const auto it = waits_.find(r);
      if (it == waits_.end()) continue;
      auto& missing = it->second.missing;
      missing.insert(missing.end(), late.begin(), late.end());
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
    }
  }
}

// Per training step, how many collectives each rank issued on each family of sibling groups.
// Only steps a rank has finished count (not its latest step, nor the oldest one its ring may
// hold in part); a rank deviates where a strict majority of the family's members that finished
// the step issued another count.
void Model::find_deviations() {
  // Families as small integers, so the per-step tallies key on numbers.
  std::unordered_map<uint64_t, int> family_index;
  std::vector<std::string> family_names;
  std::unordered_map<std::string, int> by_name;
  auto family_id = [&](uint64_t group) {
    auto it = family_index.find(group);
    if (it != family_index.end()) return it->second;
    const std::string f = family_of(group);
    auto [n, fresh] = by_name.emplace(f, static_cast<int>(family_names.size()));
    if (fresh) family_names.push_back(f);
    return family_index.emplace(group, n->second).first->second;
  };
  struct Counts {
    std::map<int, std::vector<StepRun>> by_family;
    int64_t lo = 0, hi = -1;  // finished steps [lo, hi); hi is the step the rank is in
    std::set<int> families;
    int64_t at(int family, int64_t step) const {
      const auto it = by_family.find(family);
      return it == by_family.end() ? 0 : count_at(it->second, step);
    }
  };
  std::map<int, Counts> counts;
  for (const auto& d : set().dumps) {
    if (stale_[d.rank]) continue;
    const RankDigest& r = *by_rank_[d.rank].digest;
    Counts c;
    int64_t min_step = INT64_MAX, max_step = std::max<int64_t>(d.step, -1);
    for (const auto& h : r.groups) {  // in the order the ring first gave them a step
      if (h.steps.empty()) continue;
      auto& runs = c.by_family[family_id(h.group)];
      runs = runs.empty() ? h.steps : add_runs(runs, h.steps);
      min_step = std::min(min_step, h.steps.front().first);
      max_step = std::max(max_step, h.steps.back().last);
    }
    if (min_step == INT64_MAX) continue;
    const bool wrapped = d.recorded > r.entries;
    c.lo = wrapped ? min_step + 1 : min_step;
    c.hi = max_step;
    for (const GroupInfo* g : r.registered) {
      if (std::find(g->ranks.begin(), g->ranks.end(), d.rank) != g->ranks.end()) {
        c.families.insert(family_id(g->id));
      }
    }
    counts[d.rank] = std::move(c);
  }
  // Whether a member of `rank`'s own group of `family` issued, in `step`, more (skipped) or, with
  // the step finished, fewer (added) collectives than `count`.
  auto group_disagrees = [&](int rank, int family, int64_t step, int64_t count, bool skipped) {
    for (const GroupInfo* g : dump_of(rank)->digest->registered) {
      if (family_id(g->id) != family ||
          std::find(g->ranks.begin(), g->ranks.end(), rank) == g->ranks.end()) {
        continue;
      }
      for (int m : g->ranks) {
        const auto it = counts.find(m);
        if (m == rank || it == counts.end() || step < it->second.lo || step > it->second.hi)
          continue;
        const int64_t k = it->second.at(family, step);
        if (skipped ? k > count : (step < it->second.hi && k < count)) return true;
      }
    }
    return false;
  };
  // No majority (two ranks, or an even split): ranks that broke their own rhythm in this step
  // (each issued the same count in each of at least three other finished steps) while every
  // other voter kept its own, deviated.
  auto rhythm = [&](int rank, int family,
                    int64_t skip_step) -> std::optional<std::pair<int64_t, size_t>> {
    const Counts& c = counts.at(rank);
    std::optional<int64_t> value;
    size_t n = 0;
    for (int64_t s = c.lo; s < c.hi; ++s) {
      if (s == skip_step) continue;
      const int64_t k = c.at(family, s);
      if (value && *value != k) return std::nullopt;
      value = k;
      ++n;
    }
    if (!value || n < 3) return std::nullopt;
    return std::make_pair(*value, n);
  };
  // A rank's earliest deviation: by step, then the majority rule before the rhythm rule, then
  // the family met first.
  std::map<int, std::pair<std::tuple<int64_t, int, int>, StepDeviation>> earliest;
  auto propose = [&](std::tuple<int64_t, int, int> order, StepDeviation dev) {
    auto [it, fresh] = earliest.try_emplace(dev.rank, order, dev);
    if (!fresh && order < it->second.first) it->second = {order, std::move(dev)};
  };
  // Votes at (family, step), a step at a time: ranks that finished the step give their count; a
  // rank now in the step gives a lower bound (it may issue more). A rank that finished the step
  // with count c skipped a collective when a strict majority of the voters issued more than c,
  // and added one when a strict majority finished the step with fewer.
  struct Vote {
    int rank;
    int64_t count;
    bool finished;
  };
  std::vector<Vote> list;
  for (int family = 0; family < static_cast<int>(family_names.size()); ++family) {
    std::vector<std::pair<int, const Counts*>> voters;
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (const auto& [rank, c] : counts) {
      if (!c.families.count(family) || c.lo > c.hi) continue;
      voters.emplace_back(rank, &c);
      first = std::min(first, c.lo);
      last = std::max(last, c.hi);
    }
    const std::string& f = family_names[static_cast<size_t>(family)];
    const std::string name = f.substr(0, f.find('\x1f'));
    for (int64_t step = first; !voters.empty() && step <= last; ++step) {
      list.clear();
      for (const auto& [rank, c] : voters) {
        if (step >= c->lo && step <= c->hi)
          list.push_back({rank, c->at(family, step), step < c->hi});
      }
      // Fast path: everyone agrees.
      if (std::all_of(list.begin(), list.end(),
                      [&](const Vote& v) { return v.count == list.front().count; })) {
        continue;
      }
      for (const Vote& v : list) {
        if (!v.finished) continue;
        std::map<int64_t, size_t> more, fewer;  // count -> voters
        size_t n_more = 0, n_fewer = 0;
        for (const Vote& o : list) {
          if (o.count > v.count) {
            ++more[o.count];
            ++n_more;
          } else if (o.finished && o.count < v.count) {
            ++fewer[o.count];
            ++n_fewer;
          }
        }
        const auto& side = 2 * n_more > list.size() ? more : fewer;
        if (2 * std::max(n_more, n_fewer) <= list.size()) continue;
        const auto norm =
            std::max_element(side.begin(), side.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; });
        propose({step, 0, family},
                {v.rank, name, step, v.count, norm->first, std::max(n_more, n_fewer), false,
                 group_disagrees(v.rank, family, step, v.count, v.count < norm->first)});
      }
      if (list.size() < 2) continue;
      std::vector<std::pair<const Vote*, std::pair<int64_t, size_t>>> odd;
      bool settled = true;
      for (const Vote& v : list) {
        const auto r = rhythm(v.rank, family, step);
        if (!r) {
          settled = false;
          break;
        }
        const bool keeps = v.finished ? v.count == r->first : v.count <= r->first;
        if (keeps) continue;
        if (!v.finished) {
          settled = false;
          break;
        }
        odd.emplace_back(&v, *r);
      }
      if (!settled || odd.empty() || odd.size() == list.size()) continue;
      for (const auto& [v, r] : odd) {
        propose({step, 1, family},
                {v->rank, name, step, v->count, r.first, r.second, true,
                 group_disagrees(v->rank, family, step, v->count, v->count < r.first)});
      }
    }
  }
  // Only deviations that broke the rank's own group count as evidence: sibling groups may run
  // different numbers of collectives legitimately (pipeline stages of unequal size), the
  // members of one group never.
  for (auto& [rank, best] : earliest) {
    if (best.second.in_group) deviations_[rank] = std::move(best.second);
  }
}

RankPosition Model::position(int rank) const {
  RankPosition p;
  p.rank = rank;
  const Dump* dump = dump_of(rank);
  if (dump == nullptr) {
    p.where = exits_.count(rank) ? RankPosition::Where::kExited : RankPosition::Where::kNoDump;
    p.summary = p.place = exits_.count(rank) ? death(rank) + ", no dump" : death(rank);
    return p;
  }
  const RankDump* d = dump->header;
  p.step = d->step;
  p.last_event = dump->digest->last_event;
  if (exited_with_ring(rank) && !aborted_after_failure(rank)) {
    // It ended by itself (exit) before any of its operations failed; its ring says where.
    const HeldEntry* last = nullptr;
    for (const auto& e : dump->digest->held) {
      if (e.finished()) last = &e;
    }
    p.where = RankPosition::Where::kExited;
    p.place = death(rank);
    p.summary =
        last == nullptr
            ? p.place
            : fmt::format("{} after {} {}", p.place,
                          last->is_p2p() ? fmt::format("{} #{} (group '{}')", op_name(last->op),
                                                       last->p2p_seq, group_name(last->group_id))
                                         : describe_collective(last->group_id, last->seq, *last),
                          state_name(last->state));
    return p;
  }
  const HeldEntry* last_done = nullptr;
  const HeldEntry* pending = nullptr;
  for (const auto& e : dump->digest->held) {
    if (e.finished()) last_done = &e;
    if (!e.finished() && pending == nullptr) pending = &e;
  }
  auto describe_entry = [&](const HeldEntry& e) {
    const std::string& text = call(e.call).text;
    return e.is_p2p() ? fmt::format("{} #{} (group '{}'{})", op_name(e.op), e.p2p_seq,
                                    group_name(e.group_id), text.empty() ? "" : "; " + text)
                      : describe_collective(e.group_id, e.seq, e);
  };
  std::string where, place;
  const auto it = waits_.find(rank);
  if (crashed(rank)) {
    place = pending != nullptr ? fmt::format("{} in {}", death(rank), describe_entry(*pending))
            : last_done != nullptr
                ? fmt::format("{} in compute after {} {}", death(rank), describe_entry(*last_done),
                              state_name(last_done->state))
                : death(rank);
    where = place;
    p.where = RankPosition::Where::kCrashed;
  } else if (const auto late = late_.find(rank); late != late_.end()) {
    const LateArrival& l = late->second;
    const std::string op = describe_collective(l.op.group, l.op.seq, *l.entry);
    const std::string others = l.gave_up.size() == 1 ? fmt::format("rank {}", l.gave_up.front())
                                                     : "ranks " + format_rank_list(l.gave_up);
    if (l.stalled_inside) {
      place = fmt::format("stopped inside {}: it failed there only after {} had given up in it", op,
                          others);
      where = fmt::format(
          "stopped inside {}: it failed there {} after {} had given up in it (a stopped or "
          "descheduled process)",
          op, format_duration(Nanoseconds(l.late_ns)), others);
    } else {
      place = fmt::format("joined {} only after {} had given up waiting in it", op, others);
      where = fmt::format("joined {} {} after {} had given up waiting in it", op,
                          format_duration(Nanoseconds(l.late_ns)), others);
    }
    p.where = RankPosition::Where::kLate;
  } else if (it != waits_.end()) {
    const Wait& w = it->second;
    const std::string op = w.op.p2p ? describe_p2p(w.op, w.op.dst == rank, w.entry)
                                    : describe_collective(w.op.group, w.op.seq, *w.entry);
    if (w.entry->state == EntryState::kFailed) {
      place = fmt::format("stuck in {} until it failed", op);
      where =
          fmt::format("{} after {}", place,
                      format_duration(Nanoseconds(w.entry->completed_ns - w.entry->enqueued_ns)));
      if (aborted_after_failure(rank)) {
        const std::string died = death(rank).replace(0, 7, "then died");  // "crashed (SIGABRT)"
        place += ", " + died;
        where += ", " + died;
      }
    } else {
      place = fmt::format("waiting in {}", op);
      where = fmt::format("{} for {}", place,
                          format_duration(Nanoseconds(d->monotonic_ns - w.entry->enqueued_ns)));
    }
    p.where = RankPosition::Where::kInOperation;
  } else if (const auto& open = dump->digest->open_spans; !open.empty()) {
    // Inside spans of its own work that never ended (the pipeline's action, FSDP's block): say
    // which, outermost first, and for how long the outermost has run.
    std::string spans;
    for (const auto& s : open) spans += (spans.empty() ? "" : " > ") + s.text;
    const std::string after = last_done == nullptr
                                  ? ""
                                  : fmt::format(", after {} {}", describe_entry(*last_done),
                                                state_name(last_done->state));
    place = fmt::format("in compute: {}{}", spans, after);
    where =
        fmt::format("in compute: {} for {}{}", spans,
                    format_duration(Nanoseconds(d->monotonic_ns - open.front().started_ns)), after);
    p.where = RankPosition::Where::kInCompute;
  } else if (last_done != nullptr) {
    const std::string op = describe_entry(*last_done);
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

std::set<Op> Model::waited_on_in(int rank) const {
  std::set<Op> ops;
  for (const auto& [r, w] : waits_) {
    if (std::binary_search(w.missing.begin(), w.missing.end(), rank)) ops.insert(w.op);
  }
  return ops;
}

bool Model::has_siblings(uint64_t group) const {
  const auto it = families_.find(family_of(group));
  return it != families_.end() && it->second.size() > 1;
}

Model::SiblingProgress Model::sibling_progress(uint64_t group, uint64_t seq) const {
  SiblingProgress p;
  const auto it = families_.find(family_of(group));
  if (it == families_.end()) return p;
  for (uint64_t g : it->second) {
    if (g == group) continue;
    for (int r : groups_.at(g)->ranks) {
      if (dump_of(r) == nullptr || stale_[r]) continue;
      ++p.members;
      if (reached(r, g) >= seq) ++p.reached;
    }
  }
  return p;
}

std::vector<std::pair<uint64_t, SeqKey>> Model::contested() const {
  std::vector<std::pair<uint64_t, SeqKey>> out;
  for (const auto& [group, aligned] : digest_.alignments()) {
    for (const auto& [key, a] : aligned.keys) {
      if (a.classes.size() > 1) out.emplace_back(group, key);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::vector<MemberClass>> Model::sibling_members(uint64_t group,
                                                             const SeqKey& key) const {
  std::vector<std::vector<MemberClass>> out;
  const auto it = families_.find(family_of(group));
  if (it == families_.end()) return out;
  for (uint64_t g : it->second) {
    if (g != group) out.push_back(digest_.classes(g, key));
  }
  return out;
}

std::optional<Digest::Found> Model::entry_at(int rank, const std::string& family,
                                             uint64_t seq) const {
  const auto it = families_.find(family);
  if (it == families_.end()) return std::nullopt;
  for (uint64_t g : it->second) {
    if (!member_of(rank, g)) continue;
    if (auto found = digest_.collective_at(dump_of(rank)->index, g, seq)) return found;
  }
  return std::nullopt;
}

std::pair<size_t, size_t> Model::order_votes(const Op& a, const Op& b) const {
  // Every rank in a group of a's family and one of b's votes by the order of its two entries
  // (record ids); a rank blocked in one of them that never issued the other votes for the one
  // it is blocked in.
  const std::string fa = family_of(a.group), fb = family_of(b.group);
  size_t a_first = 0, b_first = 0;
  auto in_family = [&](int rank, const std::string& family) {
    const auto it = families_.find(family);
    return it != families_.end() && std::any_of(it->second.begin(), it->second.end(),
                                                [&](uint64_t g) { return member_of(rank, g); });
  };
  std::vector<int> voters;
  std::vector<Digest::Lookup> lookups;  // entries past a window are read again, all at once
  for (const auto& d : set().dumps) {
    if (stale_[d.rank] || !in_family(d.rank, fa) || !in_family(d.rank, fb)) continue;
    voters.push_back(d.rank);
    for (const auto& [family, seq] : {std::pair(&fa, a.seq), std::pair(&fb, b.seq)}) {
      for (uint64_t g : families_.at(*family)) {
        if (member_of(d.rank, g)) lookups.emplace_back(dump_of(d.rank)->index, g, seq);
      }
    }
  }
  digest_.prefetch(lookups);
  for (int rank : voters) {
    const auto ea = entry_at(rank, fa, a.seq);
    const auto eb = entry_at(rank, fb, b.seq);
    if (ea && eb) {
      (ea->record_id < eb->record_id ? a_first : b_first)++;
    } else if (ea && (!ea->finished || !issued_counterpart(rank, b))) {
      ++a_first;  // blocked in a, or done with it and never at b: a comes first in its program
    } else if (eb && (!eb->finished || !issued_counterpart(rank, a))) {
      ++b_first;
    }
  }
  return {a_first, b_first};
}

const HeldEntry* Model::p2p_entry(int rank, const Op& op, uint64_t seq) const {
  const Dump* d = dump_of(rank);
  const auto git = groups_.find(op.group);
  if (d == nullptr || git == groups_.end() || !op.p2p || (rank != op.src && rank != op.dst)) {
    return nullptr;
  }
  const auto& members = git->second->ranks;
  const int other = rank == op.src ? op.dst : op.src;
  const auto at = std::find(members.begin(), members.end(), other);
  if (at == members.end()) return nullptr;
  const int32_t peer = static_cast<int32_t>(at - members.begin());
  const OpType kind = rank == op.src ? OpType::kSend : OpType::kRecv;
  for (const auto& h : d->digest->held) {
    if (h.group_id == op.group && h.op == kind && h.peer == peer && h.p2p_seq == seq) return &h;
  }
  return nullptr;
}

bool Model::issued_counterpart(int rank, const Op& op) const {
  const auto it = families_.find(family_of(op.group));
  if (it == families_.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(),
                     [&](uint64_t g) { return member_of(rank, g) && reached(rank, g) >= op.seq; });
}

std::pair<size_t, size_t> Model::past_order(int rank, const Op& a, const HeldEntry& ea, int b_rank,
                                            const Op& b, const HeldEntry& eb) const {
  const Dump* d = dump_of(rank);
  const Dump* db = dump_of(b_rank);
  if (d == nullptr || db == nullptr || a.p2p || b.p2p || ea.step < 0 || eb.step < 0) {
    return {0, 0};
  }
  // Where an entry of `owner` stands within its step: the how-many-th collective of its group.
  auto place_in_step = [](const Dump& owner, uint64_t group, const HeldEntry& e) {
    size_t before = 0;
    for (const auto& h : owner.digest->held) {
      if (h.group_id == group && h.is_collective() && h.step == e.step && h.seq < e.seq) ++before;
    }
    return before;
  };
  const size_t ka = place_in_step(*d, a.group, ea), kb = place_in_step(*db, b.group, eb);
  const std::string fa = family_of(a.group), fb = family_of(b.group);
  // The rank's own groups of the two families, and its collectives in them by step.
  std::map<int64_t, std::vector<const HeldEntry*>> in_a, in_b;
  int64_t oldest = INT64_MAX;
  for (const auto& h : d->digest->held) {
    if (!h.is_collective() || h.step < 0) continue;
    oldest = std::min(oldest, h.step);
    const std::string f = family_of(h.group_id);
    if (f == fa) in_a[h.step].push_back(&h);
    if (f == fb) in_b[h.step].push_back(&h);
  }
  size_t a_first = 0, b_first = 0;
  for (int64_t t = oldest + 1; t < std::min(ea.step, eb.step); ++t) {  // the oldest may be cut
    const auto ia = in_a.find(t), ib = in_b.find(t);
    if (ia == in_a.end() || ib == in_b.end() || ia->second.size() <= ka ||
        ib->second.size() <= kb) {
      continue;
    }
    (ia->second[ka]->record_id < ib->second[kb]->record_id ? a_first : b_first)++;
  }
  return {a_first, b_first};
}

std::vector<StragglerStats> Model::stragglers() const {
  // A collective counts against the rank that arrived clearly last: later than the next latest
  // by at least straggler_min_lag and by straggler_duration_factor times the collective's own
  // duration (from the last arrival to its completion), after subtracting what the rank spent in
  // its previous operation (a rank that is late because it waited for another one in its
  // previous collective inherited the lateness; it did not straggle).
  const int64_t min_lag = options_.straggler_min_lag.count();
  std::vector<size_t> samples(world_size_, 0), last(world_size_, 0);
  std::vector<std::vector<int64_t>> lags(world_size_), durations(world_size_);
  for (const auto& [group, aligned] : digest_.alignments()) {
    const auto git = groups_.find(group);
    if (git == groups_.end() || git->second->ranks.size() < 2) continue;
    for (const auto& [key, a] : aligned.keys) {
      if (a.count != git->second->ranks.size() || !a.completed) continue;
      const int64_t lag = a.last_at - a.second_at;
      const int64_t duration = std::max<int64_t>(a.last_done - a.last_at, 0);
      const int64_t own_delay = lag - a.last_waited;
      const int64_t needed = std::max<int64_t>(
          min_lag,
          static_cast<int64_t>(options_.straggler_duration_factor * static_cast<double>(duration)));
      if (lag < needed) continue;  // no clear last arrival
      for (const auto& c : digest_.classes(group, key)) {
        for (int r : c.ranks) {
          if (r >= 0 && r < world_size_) ++samples[r];
        }
      }
      if (own_delay < needed || a.last_rank < 0 || a.last_rank >= world_size_) continue;
      ++last[a.last_rank];
      lags[a.last_rank].push_back(lag);
      durations[a.last_rank].push_back(duration);
    }
  }
  std::vector<StragglerStats> out;
  for (int r = 0; r < world_size_; ++r) {
    if (last[r] < options_.straggler_min_samples) continue;
    if (static_cast<double>(last[r]) < options_.straggler_fraction * samples[r]) continue;
    auto median = [](std::vector<int64_t>& v) {
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    out.push_back({r, samples[r], last[r], median(lags[r]), median(durations[r])});
  }
  return out;
}

std::string Model::group_name(uint64_t group) const {
  const auto it = groups_.find(group);
  return it == groups_.end() ? fmt::format("#{}", group) : it->second->name;
}

std::vector<int> Model::made_group(int rank, std::string_view name) const {
  const Dump* d = dump_of(rank);
  if (d == nullptr) return {};
  for (const GroupInfo* g : d->digest->registered) {
    if (g->name == name && std::find(g->ranks.begin(), g->ranks.end(), rank) != g->ranks.end()) {
      return g->ranks;
    }
  }
  return {};
}

std::string Model::describe_collective(uint64_t group, uint64_t seq, const Call& e,
                                       int64_t step) const {
  // A scoped thread's call names its purpose: "(checkpoint writer thread, no step, ...)".
  const std::string when = (e.purpose.empty() ? "" : e.purpose + " thread, ") +
                           (step >= 0 ? fmt::format("step {}", step) : "no step");
  std::string args;
  if (e.op == OpType::kSplit) {
    args = e.text.empty() ? "" : fmt::format(", making '{}'", e.text);
    return fmt::format("split #{} of group '{}' ({}{})", seq, group_name(group), when, args);
  }
  if (e.input.dtype[0] != '\0') {
    args = fmt::format(", {}[{}]", e.input.dtype, e.input.numel);
  }
  if ((e.op == OpType::kAllReduce || e.op == OpType::kReduceScatter) && e.reduce_op) {
    args += fmt::format(", {}", reduce_op_text(e.reduce_op));
  }
  if (e.op == OpType::kBroadcast && e.root >= 0) args += fmt::format(", root {}", e.root);
  return fmt::format("{} #{} of group '{}' ({}{})", op_name(e.op), seq, group_name(group), when,
                     args);
}

std::string Model::describe_p2p(const Op& op, bool as_recv, const HeldEntry* entry) const {
  const std::string text = entry != nullptr ? call(entry->call).text : std::string();
  const std::string what = text.empty() ? "" : fmt::format(" ({})", text);
  if (as_recv) {
    return fmt::format("recv #{} at rank {} from rank {} in group '{}'{}", op.seq, op.dst, op.src,
                       group_name(op.group), what);
  }
  return fmt::format("send #{} from rank {} to rank {} in group '{}'{}", op.seq, op.src, op.dst,
                     group_name(op.group), what);
}

std::string Model::describe_deviation(const StepDeviation& d) const {
  if (d.own_rhythm) {
    return fmt::format(
        "rank {} issued {} collective{} on '{}' in step {}, where it issued {} in each of its {} "
        "other finished steps and the other members kept their own rhythm: it {} one there",
        d.rank, d.count, d.count == 1 ? "" : "s", d.family, d.step, d.norm, d.agreeing,
        d.count < d.norm ? "skipped" : "added");
  }
  return fmt::format(
      "rank {} issued {} collective{} on '{}' in step {}, where {} other member{} of '{}' "
      "groups issued {}{}: it {} one there",
      d.rank, d.count, d.count == 1 ? "" : "s", d.family, d.step, d.agreeing,
      d.agreeing == 1 ? "" : "s", d.family, d.count < d.norm ? "at least " : "", d.norm,
      d.count < d.norm ? "skipped" : "added");
}

}  // namespace tessel::fr::internal
