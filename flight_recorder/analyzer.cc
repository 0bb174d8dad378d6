#include "tessel/flight_recorder/analyzer.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "tessel/base/clock.h"
#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/analysis_model.h"

namespace tessel::fr {

std::string_view verdict_status_name(VerdictStatus status) {
  switch (status) {
    case VerdictStatus::kHealthy:
      return "healthy";
    case VerdictStatus::kCulpritFound:
      return "culprit_found";
    case VerdictStatus::kInconclusive:
      return "inconclusive";
  }
  return "unknown";
}

std::string_view finding_kind_name(FindingKind kind) {
  switch (kind) {
    case FindingKind::kNotJoined:
      return "not_joined";
    case FindingKind::kExtraCollective:
      return "extra_collective";
    case FindingKind::kMismatch:
      return "mismatch";
    case FindingKind::kUnmatchedSend:
      return "unmatched_send";
    case FindingKind::kUnmatchedRecv:
      return "unmatched_recv";
    case FindingKind::kDeadlock:
      return "deadlock";
    case FindingKind::kCrashed:
      return "crashed";
  }
  return "unknown";
}

std::string_view where_name(RankPosition::Where where) {
  switch (where) {
    case RankPosition::Where::kInOperation:
      return "in_operation";
    case RankPosition::Where::kInCompute:
      return "in_compute";
    case RankPosition::Where::kNoDump:
      return "no_dump";
    case RankPosition::Where::kStale:
      return "stale";
    case RankPosition::Where::kCrashed:
      return "crashed";
    case RankPosition::Where::kExited:
      return "exited";
    case RankPosition::Where::kLate:
      return "late";
  }
  return "unknown";
}

std::string format_rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? std::to_string(ranks[i])
                  : fmt::format("{}{}{}", ranks[i], j == i + 1 ? "," : "-", ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {

using internal::MemberClass;
using internal::Model;
using internal::Op;

std::vector<int> sorted(std::set<int> s) { return {s.begin(), s.end()}; }

std::string ranks_phrase(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", format_rank_list(ranks));
}

// "rank 3 waits" / "ranks 0-2 wait".
std::string ranks_verb(const std::vector<int>& ranks, std::string_view verb) {
  return fmt::format("{} {}{}", ranks_phrase(ranks), verb, ranks.size() == 1 ? "s" : "");
}

// "rank 3 is" / "ranks 0-2 are".
std::string ranks_are(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks_phrase(ranks), ranks.size() == 1 ? "is" : "are");
}

// Signature fields that every member of a collective must agree on.
struct Signature {
  OpType op;
  std::optional<ReduceOp> reduce_op;
  int32_t root;
  std::string_view dtype;  // into the call, which outlives the signature
  int64_t in_numel, out_numel;
  std::string_view name;  // split: the requested name of the new group
  bool operator<(const Signature& o) const {
    return std::tie(op, reduce_op, root, dtype, in_numel, out_numel, name) <
           std::tie(o.op, o.reduce_op, o.root, o.dtype, o.in_numel, o.out_numel, o.name);
  }
  bool operator==(const Signature& o) const { return !(*this < o) && !(o < *this); }
};

Signature signature_of(const internal::Call& e, bool compare_names) {
  Signature s{e.op, std::nullopt, -1, e.input.dtype, -1, -1, {}};
  if (e.op == OpType::kAllReduce || e.op == OpType::kReduceScatter) s.reduce_op = e.reduce_op;
  if (e.op == OpType::kBroadcast) s.root = e.root;
  // What every member must agree on: all_gather's output (inputs may be uneven), reduce_scatter's
  // input (outputs may be uneven); all_to_all may split unevenly and a barrier carries nothing.
  switch (e.op) {
    case OpType::kAllReduce:
    case OpType::kBroadcast:
      s.in_numel = e.input.numel;
      s.out_numel = e.output.numel;
      break;
    case OpType::kAllGather:
      s.out_numel = e.output.numel;
      break;
    case OpType::kReduceScatter:
      s.in_numel = e.input.numel;
      break;
    case OpType::kSplit:
      s.dtype = {};
      if (compare_names) s.name = e.text;
      break;
    default:
      break;
  }
  return s;
}

std::string describe_difference(const Signature& mine, const Signature& theirs,
                                std::string_view others) {
  if (mine.op != theirs.op) {
    return fmt::format("called {} where {} called {}", op_name(mine.op), others,
                       op_name(theirs.op));
  }
  if (mine.reduce_op != theirs.reduce_op) {
    return fmt::format("reduced with {} where {} used {}", reduce_op_text(mine.reduce_op), others,
                       reduce_op_text(theirs.reduce_op));
  }
  if (mine.root != theirs.root) {
    return fmt::format("broadcast from root {} where {} used root {}", mine.root, others,
                       theirs.root);
  }
  if (mine.dtype != theirs.dtype) {
    return fmt::format("passed dtype {} where {} passed {}", mine.dtype, others, theirs.dtype);
  }
  if (mine.name != theirs.name) {
    return fmt::format("created group '{}' where {} created '{}'", mine.name, others, theirs.name);
  }
  if (mine.in_numel < 0) {
    return fmt::format("passed {} output elements where {} passed {}", mine.out_numel, others,
                       theirs.out_numel);
  }
  if (mine.out_numel < 0) {
    return fmt::format("passed {} input elements where {} passed {}", mine.in_numel, others,
                       theirs.in_numel);
  }
  return fmt::format("passed {} input / {} output elements where {} passed {} / {}", mine.in_numel,
                     mine.out_numel, others, theirs.in_numel, theirs.out_numel);
}

class Analysis {
 public:
  Analysis(const internal::Digest& digest, const AnalyzerOptions& options) : m_(digest, options) {}

  Verdict run() {
    v_.world_size = m_.world_size();
    v_.dumps = static_cast<int>(m_.set().dumps.size());
    for (int r = 0; r < m_.world_size(); ++r) v_.positions.push_back(m_.position(r));
    find_mismatches();
    find_waits();
    find_stragglers();
    add_notes();
    std::set<int> all;
    for (const auto& f : v_.findings) all.insert(f.culprits.begin(), f.culprits.end());
    v_.culprits = sorted(all);
    std::set<int> suspects;
    if (v_.culprits.empty()) suspects = suspects_;
    v_.suspects = sorted(suspects);
    v_.status = !v_.culprits.empty()       ? VerdictStatus::kCulpritFound
                : !v_.inconclusive.empty() ? VerdictStatus::kInconclusive
                                           : VerdictStatus::kHealthy;
    return std::move(v_);
  }

 private:
  // Pipeline evidence, from the runtime's text on sends and receives ("pipeline SEND_F2s1>2: mb
  // 2, stage 1"): the first send of `rank`'s that its receiver took for another action or
  // micro-batch (a send skipped or reordered); "" when there is none.
  std::string pipeline_mismatch(int rank) const {
    // "F2" from "pipeline SEND_F2s1>2: ..." (kind and micro-batch), "" when not a pipeline text.
    const auto action_of = [](std::string_view text) -> std::string_view {
      constexpr std::string_view kPrefix = "pipeline ";
      if (text.substr(0, kPrefix.size()) != kPrefix || text.size() < kPrefix.size() + 6) return {};
      text.remove_prefix(kPrefix.size() + 5);  // "SEND_" / "RECV_"
      return text.substr(0, text.find('s'));
    };
    const auto* held = m_.held(rank);
    if (held == nullptr) return {};
    for (const auto& h : *held) {
      if (h.op != OpType::kSend) continue;
      const std::string_view sent = action_of(m_.call(h.call).text);
      const GroupInfo* g = m_.group_info(h.group_id);
      if (sent.empty() || g == nullptr || h.peer < 0 ||
          h.peer >= static_cast<int32_t>(g->ranks.size())) {
        continue;
      }
      const int dst = g->ranks[static_cast<size_t>(h.peer)];
      const Op op{h.group_id, h.p2p_seq, true, rank, dst};
      const auto* r = m_.p2p_entry(dst, op, h.p2p_seq);
      if (r == nullptr) continue;
      const std::string_view expected = action_of(m_.call(r->call).text);
      if (expected.empty() || expected == sent) continue;
      return fmt::format("{} was taken by rank {} as ({}): rank {} skipped or reordered a send",
                         m_.describe_p2p(op, false, &h), dst, m_.call(r->call).text, rank);
    }
    return {};
  }

  // A pipeline rank's newest send or receive that failed (the runtime's text on it: "pipeline
  // RECV_F3s2<1: mb 3, stage 2"): what it waited in before it left the others waiting; "" when
  // there is none.
  std::string pipeline_failure(int rank) const {
    const auto* held = m_.held(rank);
    if (held == nullptr) return {};
    for (auto it = held->rbegin(); it != held->rend(); ++it) {
      if (!it->is_p2p() || it->state != EntryState::kFailed) continue;
      const std::string& text = m_.call(it->call).text;
      const GroupInfo* g = m_.group_info(it->group_id);
      if (text.rfind("pipeline ", 0) != 0 || g == nullptr || it->peer < 0 ||
          it->peer >= static_cast<int32_t>(g->ranks.size())) {
        return {};
      }
      const int peer = g->ranks[static_cast<size_t>(it->peer)];
      const bool send = it->op == OpType::kSend;
      const Op op{it->group_id, it->p2p_seq, true, send ? rank : peer, send ? peer : rank};
      return fmt::format("rank {} gave up in {} first: rank {} never posted its half", rank,
                         m_.describe_p2p(op, !send, &*it), peer);
    }
    return {};
  }

  // A split that made several groups and named each its own way (a pipeline's point-to-point
  // pairs): the names differ, but no rank's new group, as its dump registers it, holds a rank
  // that asked for another name. Then the names do not disagree. False when a dump does not say.
  bool split_into_named_groups(const std::vector<MemberClass>& members) const {
    std::map<int, std::string_view> name_of;
    std::set<std::string_view> names;
    for (const auto& c : members) {
      const internal::Call& call = m_.call(c.call);
      if (call.op != OpType::kSplit) return false;
      for (int r : c.ranks) name_of[r] = call.text;
      names.insert(call.text);
    }
    if (names.size() < 2) return false;
    for (const auto& [rank, name] : name_of) {
      const std::vector<int> made = m_.made_group(rank, name);
      if (made.empty()) return false;
      for (int other : made) {
        const auto it = name_of.find(other);
        if (it != name_of.end() && it->second != name) return false;
      }
    }
    return true;
  }

  // Argument mismatches: at each (group, seq) whose members disagree, the ranks that disagree
  // with a strict majority of the members and of the members of sibling groups at that seq.
  void find_mismatches() {
    std::set<uint64_t> done;  // later seqs of a group are unreliable once one mismatched
    for (const auto& [group, key] : m_.contested()) {
      if (done.count(group)) continue;
      const uint64_t seq = key.first;
      const std::vector<MemberClass> members = m_.members(group, key);
      const std::vector<std::vector<MemberClass>> siblings = m_.sibling_members(group, key);
      // Split names are compared only when every rank asked for one (mesh dimensions do).
      bool compare_names = true;
      for (const auto& c : members) compare_names &= !m_.call(c.call).text.empty();
      for (const auto& list : siblings) {
        for (const auto& c : list) compare_names &= !m_.call(c.call).text.empty();
      }
      if (compare_names && split_into_named_groups(members)) compare_names = false;
      // Ranks by signature. A signature's example is the call of its lowest rank among the
      // members, or else in the first sibling group that made it.
      std::map<Signature, std::vector<int>> classes, everyone;
      std::map<Signature, std::pair<size_t, const MemberClass*>> example;  // (source, call)
      auto add = [&](const MemberClass& c, size_t source) {
        const Signature sig = signature_of(m_.call(c.call), compare_names);
        if (source == 0) classes[sig].insert(classes[sig].end(), c.ranks.begin(), c.ranks.end());
        everyone[sig].insert(everyone[sig].end(), c.ranks.begin(), c.ranks.end());
        const auto [it, fresh] = example.try_emplace(sig, source, &c);
        if (!fresh && it->second.first == source && c.first_rank < it->second.second->first_rank) {
          it->second.second = &c;
        }
      };
      for (const auto& c : members) add(c, 0);
      if (classes.size() == 1) continue;
      for (auto& [sig, ranks] : classes) std::sort(ranks.begin(), ranks.end());
      for (size_t i = 0; i < siblings.size(); ++i) {
        for (const auto& c : siblings[i]) add(c, i + 1);
      }
      const bool has_siblings = std::any_of(siblings.begin(), siblings.end(),
                                            [](const auto& list) { return !list.empty(); });
      const auto describe = [&](const Signature& sig) {
        const MemberClass& c = *example.at(sig).second;
        return m_.describe_collective(group, seq, m_.call(c.call), c.first_step);
      };
      const Signature* best = nullptr;
      size_t total = 0;
      for (const auto& [sig, ranks] : everyone) {
        total += ranks.size();
        if (best == nullptr || ranks.size() > everyone[*best].size()) best = &sig;
      }
      const bool majority = 2 * everyone[*best].size() > total;
      const std::string where = describe(*best);
      const std::string others =
          !has_siblings ? "the others"
                        : fmt::format("the others in '{}' groups", m_.group_name(group));
      if (!majority) {
        std::string split;
        std::set<int> involved;
        for (const auto& [sig, ranks] : classes) {
          const Signature& other = sig == classes.begin()->first ? std::next(classes.begin())->first
                                                                 : classes.begin()->first;
          split += fmt::format("; {} {}", ranks_phrase(ranks),
                               describe_difference(sig, other, ranks_phrase(classes[other])));
          involved.insert(ranks.begin(), ranks.end());
        }
        v_.inconclusive.push_back(fmt::format(
            "arguments of {} differ with no majority to tell which side deviated{}", where, split));
        suspects_.insert(involved.begin(), involved.end());
      } else {
        Finding f;
        f.kind = FindingKind::kMismatch;
        f.group_id = group;
        f.group_name = m_.group_name(group);
        f.seq = seq;
        std::set<int> minority;
        for (const auto& [sig, ranks] : classes) {
          if (sig == *best) {
            f.waiting = ranks;
            continue;
          }
          minority.insert(ranks.begin(), ranks.end());
          f.details.push_back(
              fmt::format("{} {}", ranks_phrase(ranks), describe_difference(sig, *best, others)));
        }
        f.culprits = sorted(minority);
        const size_t agree = everyone[*best].size();
        f.summary = fmt::format(
            "argument mismatch in {}: {} with the other {}{}", where,
            ranks_verb(f.culprits, "disagree"), agree,
            !has_siblings ? "" : fmt::format(" members of '{}' groups", m_.group_name(group)));
        mismatched_.insert({group, seq});
        add_finding(std::move(f));
      }
      done.insert(group);
    }
  }

  // Hangs: who waits for whom, then the culprits at the ends of the waits.
  void find_waits() {
    const auto& waits = m_.waits();  // rank -> what it waits in and on whom
    const auto components = m_.wait_cycles();
    std::set<int> in_cycle;
    for (const auto& comp : components) in_cycle.insert(comp.begin(), comp.end());

    for (const auto& comp : components) cycle_finding(comp);

    // Acyclic waits, grouped by the operation waited in.
    std::map<Op, std::vector<int>> by_op;
    for (const auto& [rank, w] : waits) {
      if (in_cycle.count(rank)) continue;
      by_op[w.op].push_back(rank);
    }
    for (const auto& [op, ranks] : by_op) {
      const auto& w = waits.at(ranks.front());
      if (w.op.p2p) {
        p2p_finding(ranks.front(), w);
      } else {
        collective_finding(ranks, w);
      }
    }
    // Ranks that died while nobody waits on them.
    std::vector<int> unexplained, crashed;
    for (int r = 0; r < m_.world_size(); ++r) {
      if (blamed_.count(r) || suspects_.count(r) || m_.waited_on(r)) continue;
      if (m_.crashed(r)) crashed.push_back(r);
    }
    for (int r : m_.set().missing_ranks) {
      if (!blamed_.count(r) && !suspects_.count(r) && !m_.waited_on(r) && !m_.exited_cleanly(r)) {
        unexplained.push_back(r);
      }
    }
    // Deviations no wait points at (yet): a rank that skipped or added a collective its own
    // group's members issued otherwise, while another fault holds the job up first.
    for (const auto& [r, dev] : m_.deviations()) {
      if (blamed_.count(r) || suspects_.count(r)) continue;
      Finding f;
      f.kind = dev.count < dev.norm ? FindingKind::kNotJoined : FindingKind::kExtraCollective;
      f.culprits = {r};
      f.summary = fmt::format(
          "rank {} {} a collective of its '{}' group in step {} (the group's later collectives "
          "then paired with the wrong ones; no rank waits on it yet)",
          r, dev.count < dev.norm ? "skipped" : "added", dev.family, dev.step);
      f.details.push_back(culprit_detail(r));
      f.details.push_back("evidence: " + m_.describe_deviation(dev));
      add_finding(std::move(f));
    }
    for (int r : crashed) {
      const internal::HeldEntry* in = m_.crash_op(r);
      if (in != nullptr && in->is_collective() && mismatched_.count({in->group_id, in->seq})) {
        v_.notes.push_back(fmt::format(
            "rank {} {}, where the mismatch above made the transport fail (a consequence, not "
            "a cause)",
            r, v_.positions[r].summary));
        continue;
      }
      Finding f;
      f.kind = FindingKind::kCrashed;
      f.culprits = {r};
      f.summary = fmt::format("rank {} {}", r, v_.positions[r].summary);
      add_finding(std::move(f));
    }
    std::vector<int> stale;
    for (const auto& p : v_.positions) {
      if (p.where == RankPosition::Where::kStale && !blamed_.count(p.rank)) stale.push_back(p.rank);
    }
    if (!stale.empty()) {
      v_.inconclusive.push_back(fmt::format(
          "{} only left stale dumps (older than the others by more than --stale-after), so "
          "where they are now is unknown",
          ranks_phrase(stale)));
    }
    if (!unexplained.empty()) {
      v_.inconclusive.push_back(
          fmt::format("no dump from {} and no live rank waits on them: were they dumped to another "
                      "directory, or did they exit?",
                      ranks_phrase(unexplained)));
    }
  }

  // Why `sink` (a member that never issued the collective and is not waiting anywhere) skipped
  // it rather than the others adding it; empty when nothing says so.
  std::string skip_evidence(int sink, uint64_t group, uint64_t seq) const {
    if (m_.dead(sink)) return fmt::format("rank {}: {}", sink, m_.death(sink));
    const auto ops = m_.waited_on_in(sink);
    if (ops.size() >= 2) {
      return fmt::format("rank {} is awaited in {} operations of different groups", sink,
                         ops.size());
    }
    const auto dev = m_.deviations().find(sink);
    if (dev != m_.deviations().end() && dev->second.count < dev->second.norm) {
      return m_.describe_deviation(dev->second);
    }
    const auto sib = m_.sibling_progress(group, seq);
    if (sib.members > 0 && 2 * sib.reached > sib.members) {
      return fmt::format("{} of the {} members of the other '{}' groups issued #{} too",
                         sib.reached, sib.members, m_.group_name(group), seq);
    }
    return "";
  }

  // Why the ranks that issued the collective added it; empty when nothing says so.
  std::string extra_evidence(const std::vector<int>& issued, uint64_t group, uint64_t seq) const {
    std::string why;
    for (int r : issued) {
      const auto dev = m_.deviations().find(r);
      if (dev == m_.deviations().end() || dev->second.count <= dev->second.norm) return "";
      if (why.empty()) why = m_.describe_deviation(dev->second);
    }
    if (!why.empty()) return why;
    const auto sib = m_.sibling_progress(group, seq);
    if (sib.members > 0 && sib.reached == 0) {
      return fmt::format("none of the {} members of the other '{}' groups issued a #{}",
                         sib.members, m_.group_name(group), seq);
    }
    return "";
  }

  // A wait at or after a mismatch of its group is a consequence of the mismatch.
  bool after_mismatch(uint64_t group, uint64_t seq) const {
    const auto it = mismatched_.lower_bound({group, 0});
    return it != mismatched_.end() && it->first == group && it->second <= seq;
  }

  void collective_finding(const std::vector<int>& waiting, const internal::Wait& w) {
    const Op& op = w.op;
    if (after_mismatch(op.group, op.seq)) return;
    const std::string where = m_.describe_collective(op.group, op.seq, *w.entry);
    if (w.missing.empty()) {
      // Every member issued it: one that died in it holds it up.
      std::vector<int> dead;
      for (int r : m_.issued(op.group, op.seq)) {
        if (m_.dead(r)) dead.push_back(r);
      }
      if (!dead.empty()) {
        Finding f;
        f.kind = FindingKind::kCrashed;
        f.group_id = op.group;
        f.group_name = m_.group_name(op.group);
        f.seq = op.seq;
        f.culprits = dead;
        f.waiting = waiting;
        f.summary = fmt::format("{} died in {}; {} in it", ranks_phrase(dead), where,
                                ranks_verb(waiting, "wait"));
        for (int s : dead) f.details.push_back(culprit_detail(s));
        add_finding(std::move(f));
        return;
      }
      v_.inconclusive.push_back(fmt::format(
          "every member of group '{}' ({}) issued {} and it did not complete: look below the "
          "recorder (transport, network, device) on those ranks",
          m_.group_name(op.group), ranks_phrase(m_.issued(op.group, op.seq)), where));
      return;
    }
    std::vector<int> sinks;
    bool others = false, all_finished = true;  // finished: alive in compute, or exited cleanly
    for (int s : w.missing) {
      if (v_.positions[s].where == RankPosition::Where::kInOperation) {
        others = true;
        continue;
      }
      sinks.push_back(s);
      all_finished &= !m_.dead(s);
    }
    if (sinks.empty()) return;  // they wait elsewhere; that wait has its own finding
    const std::vector<int> issued = m_.issued(op.group, op.seq);
    Finding f;
    f.group_id = op.group;
    f.group_name = m_.group_name(op.group);
    f.seq = op.seq;
    if (!others && all_finished && issued.size() <= w.missing.size()) {
      // The members that never issued it are done or in compute: either they skipped it or the
      // ones waiting issued one too many. Evidence decides; without it, a minority added it.
      std::string skipped;
      for (int s : sinks) {
        skipped = skip_evidence(s, op.group, op.seq);
        if (!skipped.empty()) break;
      }
      const std::string extra = extra_evidence(issued, op.group, op.seq);
      if (skipped.empty() && (!extra.empty() || issued.size() < w.missing.size())) {
        f.kind = FindingKind::kExtraCollective;
        f.culprits = issued;
        f.summary = fmt::format("{} issued {}, which the other {} members never issued",
                                ranks_phrase(issued), where, w.missing.size());
        f.details.push_back(fmt::format("{} in compute: {}", ranks_are(w.missing),
                                        v_.positions[w.missing.front()].summary));
        if (!extra.empty()) f.details.push_back(extra);
        add_finding(std::move(f));
        return;
      }
      if (skipped.empty() || !extra.empty()) {
        v_.inconclusive.push_back(fmt::format(
            "{} in {} while {} never issued it and {} {}: {} issued it as did not, and nothing "
            "tells whether {} skipped it or {} issued one too many",
            ranks_verb(issued, "wait"), where, ranks_phrase(w.missing),
            w.missing.size() == 1 ? "is" : "are", v_.positions[w.missing.front()].summary,
            issued.size() == w.missing.size() ? "as many" : "fewer", ranks_phrase(w.missing),
            ranks_phrase(issued)));
        suspects_.insert(issued.begin(), issued.end());
        suspects_.insert(w.missing.begin(), w.missing.end());
        return;
      }
      f.details.push_back("evidence: " + skipped);
    }
    f.kind = FindingKind::kNotJoined;
    std::vector<int> crashed;
    for (int s : sinks) {
      if (m_.crashed(s)) crashed.push_back(s);
    }
    if (crashed.size() == sinks.size()) f.kind = FindingKind::kCrashed;
    f.culprits = sinks;
    f.waiting = waiting;
    const bool all_late = std::all_of(sinks.begin(), sinks.end(), [&](int s) {
      return v_.positions[s].where == RankPosition::Where::kLate;
    });
    const bool stalled = all_late && std::any_of(sinks.begin(), sinks.end(), [&](int s) {
                           const auto it = m_.late().find(s);
                           return it != m_.late().end() && it->second.stalled_inside;
                         });
    f.summary = stalled ? fmt::format("{} stopped taking part in {}: {} gave up waiting for it",
                                      ranks_phrase(sinks), where, ranks_phrase(waiting))
                : all_late
                    ? fmt::format("{} did not join {} in time: {} gave up waiting in it first",
                                  ranks_phrase(sinks), where, ranks_phrase(waiting))
                    : fmt::format("{} did not join {}; {} in it", ranks_phrase(sinks), where,
                                  ranks_verb(waiting, "wait"));
    for (int s : sinks) {
      const auto dev = m_.deviations().find(s);
      if (dev != m_.deviations().end() && dev->second.count < dev->second.norm &&
          std::find(f.details.begin(), f.details.end(),
                    "evidence: " + m_.describe_deviation(dev->second)) == f.details.end()) {
        f.details.push_back("evidence: " + m_.describe_deviation(dev->second));
      }
      f.details.insert(f.details.begin(), culprit_detail(s));
      const std::string failed = pipeline_failure(s);
      if (!failed.empty()) f.details.push_back("evidence: " + failed);
    }
    add_finding(std::move(f));
  }

  // `in_cycle`: the wait is on a cycle whose culprit its missing peer is; otherwise a peer that
  // waits itself (in an op further down a ring, or one a third rank holds up) is not blamed here:
  // its own wait has a finding.
  void p2p_finding(int rank, const internal::Wait& w, bool in_cycle = false,
                   const std::string& evidence = "") {
    const Op& op = w.op;
    const bool is_send = op.src == rank;
    const std::string what = m_.describe_p2p(op, !is_send, w.entry);
    if (!in_cycle && !w.missing.empty() && !w.unknown &&
        v_.positions[w.missing.front()].where == RankPosition::Where::kInOperation) {
      return;
    }
    if (w.missing.empty()) {
      v_.inconclusive.push_back(fmt::format(
          "{} and its matching {} were both posted and did not complete: look below the "
          "recorder",
          what, is_send ? "recv" : "send"));
      return;
    }
    if (w.unknown) {
      v_.inconclusive.push_back(fmt::format(
          "{} has no match on rank {}, but that rank's ring no longer holds entries that old, "
          "so whether it skipped its half cannot be told: look at rank {}'s log around then",
          what, w.missing.front(), w.missing.front()));
      return;
    }
    Finding f;
    f.kind = is_send ? FindingKind::kUnmatchedSend : FindingKind::kUnmatchedRecv;
    f.group_id = op.group;
    f.group_name = m_.group_name(op.group);
    f.seq = op.seq;
    f.culprits = w.missing;
    f.waiting = {rank};
    f.summary = fmt::format("{} has no matching {}: rank {} never posted it", what,
                            is_send ? "recv" : "send", w.missing.front());
    f.details.push_back(culprit_detail(w.missing.front()));
    if (!evidence.empty()) f.details.push_back("evidence: " + evidence);
    const std::string skipped = pipeline_mismatch(w.missing.front());
    if (!skipped.empty()) f.details.push_back("evidence: " + skipped);
    add_finding(std::move(f));
  }

  // A cycle of waits. With an unmatched send/recv in it, the rank that did not post its half is
  // the culprit. Otherwise the ranks the evidence singles out: those whose per-step collectives
  // deviate from their siblings', or those that took the cycle's operations in the order fewer
  // ranks used. Without such evidence the cycle is symmetric: said in words, nobody blamed.
  void cycle_finding(const std::vector<int>& comp) {
    const auto& waits = m_.waits();
    const std::set<int> members(comp.begin(), comp.end());
    // The peers that did not post their half of a send/recv in the cycle. One that is itself
    // blocked in a send/recv is a link of a chain (a ring whose next rank waits on it); the one
    // that went on to another operation skipped its half. Only when every one of them is blocked
    // in a send/recv (the cycle is made of them alone) are they all named.
    std::set<int> p2p_missing, p2p_blamed;
    for (int r : comp) {
      const auto& w = waits.at(r);
      if (w.op.p2p) {
        for (int s : w.missing) {
          if (members.count(s)) p2p_missing.insert(s);
        }
      }
    }
    for (int s : p2p_missing) {
      if (!waits.at(s).op.p2p) p2p_blamed.insert(s);
    }
    // A cycle of sends and recvs alone: the peers that changed the order they kept in the
    // previous step (there they posted the half now missing before the one they are blocked in).
    std::map<int, std::string> changed;
    if (p2p_blamed.empty()) {
      for (int r : comp) {
        const auto& w = waits.at(r);
        if (!w.op.p2p || w.op.seq < 2) continue;
        for (int s : w.missing) {
          const auto ws = waits.find(s);
          if (!p2p_missing.count(s) || ws == waits.end() || ws->second.op.seq < 2) continue;
          const Op& mine = ws->second.op;
          const auto* before_missing = m_.p2p_entry(s, w.op, w.op.seq - 1);
          const auto* before_mine = m_.p2p_entry(s, mine, mine.seq - 1);
          if (before_missing == nullptr || before_mine == nullptr ||
              before_missing->record_id > before_mine->record_id) {
            continue;
          }
          const bool s_sends = w.op.src == s;
          changed[s] = fmt::format(
              "rank {} is blocked in {} without having posted {}, where it posted #{} of that "
              "before #{} of this",
              s, m_.describe_p2p(mine, mine.dst == s), m_.describe_p2p(w.op, !s_sends),
              w.op.seq - 1, mine.seq - 1);
        }
      }
      for (const auto& [s, why] : changed) p2p_blamed.insert(s);
      if (p2p_blamed.size() == p2p_missing.size()) {
        changed.clear();
        p2p_blamed = p2p_missing;
      }
      if (p2p_blamed.empty()) p2p_blamed = p2p_missing;
    }
    if (!p2p_blamed.empty()) {
      for (int r : comp) {
        const auto& w = waits.at(r);
        if (w.op.p2p && std::any_of(w.missing.begin(), w.missing.end(),
                                    [&](int s) { return p2p_blamed.count(s); })) {
          const auto why = changed.find(w.missing.front());
          p2p_finding(r, w, /*in_cycle=*/true, why == changed.end() ? "" : why->second);
        }
      }
      return;
    }
    std::vector<std::string> lines;
    std::set<std::pair<uint64_t, uint64_t>> seen;
    for (int r : comp) {
      const auto& w = waits.at(r);
      if (!seen.insert({w.op.group, w.op.seq}).second) continue;
      std::vector<int> missing;
      for (int s : w.missing) {
        if (members.count(s)) missing.push_back(s);
      }
      lines.push_back(fmt::format(
          "{} in {}, which {} never issued", ranks_verb(m_.waiting_in(w.op), "wait"),
          m_.describe_collective(w.op.group, w.op.seq, *w.entry), ranks_phrase(missing)));
    }
    // Evidence 1: per-step counts.
    std::set<int> blamed;
    std::vector<std::string> evidence;
    for (int r : comp) {
      const auto it = m_.deviations().find(r);
      if (it == m_.deviations().end()) continue;
      blamed.insert(r);
      evidence.push_back(m_.describe_deviation(it->second));
    }
    // The pairs (r, s) of the cycle where r waits in `mine` for s, which waits in another
    // operation `theirs` that r has not issued (nor its sibling counterpart): r put mine first.
    // One pair per (r, theirs): what r did is the same whichever rank waits in theirs.
    std::vector<std::pair<int, int>> pairs;
    std::set<std::pair<int, Op>> paired;
    for (int r : comp) {
      const Op& mine = waits.at(r).op;
      for (int s : waits.at(r).missing) {
        if (!members.count(s)) continue;
        const Op& theirs = waits.at(s).op;
        if (theirs == mine || !paired.insert({r, theirs}).second ||
            m_.issued_counterpart(r, theirs)) {
          continue;
        }
        pairs.emplace_back(r, s);
      }
    }
    // Evidence 2: the order each rank kept in its earlier steps. A rank that now puts mine first
    // where in every earlier step it issued their counterparts the other way round deviated.
    if (blamed.empty() || blamed.size() == comp.size()) {
      blamed.clear();
      evidence.clear();
      for (const auto& [r, s] : pairs) {
        const auto& wr = waits.at(r);
        const auto& ws = waits.at(s);
        const auto [mine_first, theirs_first] =
            m_.past_order(r, wr.op, *wr.entry, s, ws.op, *ws.entry);
        if (mine_first > 0 || theirs_first == 0 || blamed.count(r)) continue;
        blamed.insert(r);
        add_unique(evidence,
                   fmt::format("rank {} issued {} before {}, where in each of its {} earlier "
                               "step{} it issued their "
                               "counterparts the other way round",
                               r, m_.describe_collective(wr.op.group, wr.op.seq, *wr.entry),
                               m_.describe_collective(ws.op.group, ws.op.seq, *ws.entry),
                               theirs_first, theirs_first == 1 ? "" : "s"));
      }
    }
    // Evidence 3: the order in which the ranks (and their siblings) issue each pair of
    // operations on the cycle.
    if (blamed.empty() || blamed.size() == comp.size()) {
      blamed.clear();
      evidence.clear();
      for (const auto& [r, s] : pairs) {
        const Op& mine = waits.at(r).op;
        const Op& theirs = waits.at(s).op;
        const auto [mine_first, theirs_first] = m_.order_votes(mine, theirs);
        if (theirs_first > mine_first) {
          blamed.insert(r);
          add_unique(
              evidence,
              fmt::format("rank {} issued {} before {}, an order {} rank{} used, against {}", r,
                          m_.describe_collective(mine.group, mine.seq, *waits.at(r).entry),
                          m_.describe_collective(theirs.group, theirs.seq, *waits.at(s).entry),
                          mine_first, mine_first == 1 ? "" : "s", theirs_first));
        }
      }
    }
    if (blamed.empty() || blamed.size() == comp.size()) {
      std::string text = fmt::format("{} each wait for {}", ranks_phrase(comp),
                                     comp.size() == 2 ? "the other" : "another");
      for (const auto& l : lines) text += "; " + l;
      // Why the evidence is symmetric: the ranks' order votes, and no step count or earlier
      // order that sets one side apart.
      std::string votes;
      if (!pairs.empty()) {
        const auto& [r, s] = pairs.front();
        const auto [mine_first, theirs_first] = m_.order_votes(waits.at(r).op, waits.at(s).op);
        votes = mine_first == theirs_first
                    ? fmt::format(
                          ", as many ranks issued their operations in one order as in "
                          "the other ({} each)",
                          mine_first)
                    : fmt::format(
                          ", and the order votes ({} against {}) go against every one "
                          "of them alike",
                          mine_first, theirs_first);
      }
      text += fmt::format(
          "; nothing tells which of them deviated: neither a step count nor the order each kept "
          "in earlier steps sets one of them apart{}; look at what ranks {} did differently at "
          "this point of their programs",
          votes, format_rank_list(comp));
      v_.inconclusive.push_back(std::move(text));
      suspects_.insert(comp.begin(), comp.end());
      return;
    }
    Finding f;
    f.kind = FindingKind::kDeadlock;
    for (int r : comp) {
      const auto& w = waits.at(r);
      if (f.group_id == 0) {
        f.group_id = w.op.group;
        f.group_name = m_.group_name(w.op.group);
        f.seq = w.op.seq;
      }
      if (!blamed.count(r)) f.waiting.push_back(r);
    }
    f.culprits = sorted(blamed);
    f.summary = fmt::format("deadlock across groups: {} wait on each other in a cycle; {} deviated",
                            ranks_phrase(comp), ranks_phrase(f.culprits));
    f.details = lines;
    for (auto& e : evidence) f.details.push_back("evidence: " + e);
    add_finding(std::move(f));
  }

  void find_stragglers() {
    const auto stragglers = m_.stragglers();
    const bool hang = !v_.findings.empty() || !v_.inconclusive.empty();
    for (const auto& s : stragglers) {
      Straggler info;
      info.rank = s.rank;
      info.late = s.times_last;
      info.samples = s.samples;
      info.median_lag = std::chrono::nanoseconds(s.median_lag_ns);
      info.median_duration = std::chrono::nanoseconds(s.median_duration_ns);
      info.summary = fmt::format(
          "rank {} arrived last, by a median {} (the collectives themselves took a median {}), "
          "at {} of the {} collectives it took part in{}",
          s.rank, format_duration(Nanoseconds(s.median_lag_ns)),
          format_duration(Nanoseconds(s.median_duration_ns)), s.times_last, s.samples,
          hang ? " (unrelated to the hang above unless it is blamed there)" : "");
      v_.stragglers.push_back(std::move(info));
    }
  }

  void add_notes() {
    for (const auto& p : m_.set().problems) v_.notes.push_back("unusable dump: " + p.message);
    for (const auto& n : m_.notes()) v_.notes.push_back(n);
  }

  std::string culprit_detail(int rank) const {
    const auto& p = v_.positions[rank];
    std::string s = fmt::format("rank {}: {}", rank, p.summary);
    if (!p.last_event.empty()) s += fmt::format("; last marked '{}'", p.last_event);
    return s;
  }

  static void add_unique(std::vector<std::string>& lines, std::string line) {
    if (std::find(lines.begin(), lines.end(), line) == lines.end()) {
      lines.push_back(std::move(line));
    }
  }

  // Keeps one finding per (kind, culprits); a repeat adds its summary as a detail.
  void add_finding(Finding f) {
    for (auto& g : v_.findings) {
      if (g.kind == f.kind && g.culprits == f.culprits) {
        g.details.push_back("also: " + f.summary);
        return;
      }
    }
    blamed_.insert(f.culprits.begin(), f.culprits.end());
    v_.findings.push_back(std::move(f));
  }

  Model m_;
  Verdict v_;
  std::set<std::pair<uint64_t, uint64_t>> mismatched_;
  std::set<int> blamed_;
  std::set<int> suspects_;
};

}  // namespace

Verdict analyze(const DumpSet& set, const AnalyzerOptions& options) {
  TESSEL_CHECK(!set.dumps.empty(), InvalidArgument,
               "no usable flight-recorder dump to analyze ({} unusable file(s))",
               set.problems.size());
  const internal::Digest digest(set);
  return Analysis(digest, options).run();
}

DirAnalysis analyze_dump_dir(const std::filesystem::path& dir, const AnalyzerOptions& options,
                             int world_size_hint) {
  const auto digest = internal::Digest::read(dir, world_size_hint);
  DirAnalysis out;
  if (!digest->set().dumps.empty()) out.verdict = Analysis(*digest, options).run();
  out.set = digest->set();
  return out;
}

}  // namespace tessel::fr
