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
    case FindingKind::kStraggler:
      return "straggler";
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

// Signature fields that every member of a collective must agree on.
struct Signature {
  OpType op;
  std::optional<ReduceOp> reduce_op;
  int32_t root;
  std::string dtype;
  int64_t in_numel, out_numel;
  bool operator<(const Signature& o) const {
    return std::tie(op, reduce_op, root, dtype, in_numel, out_numel) <
           std::tie(o.op, o.reduce_op, o.root, o.dtype, o.in_numel, o.out_numel);
  }
  bool operator==(const Signature& o) const { return !(*this < o) && !(o < *this); }
};

Signature signature_of(const TraceEntry& e) {
  Signature s{e.op, std::nullopt, -1, e.input.dtype, -1, -1};
  if (e.op == OpType::kAllReduce || e.op == OpType::kReduceScatter) s.reduce_op = e.reduce_op;
  if (e.op == OpType::kBroadcast) s.root = e.root;
  // all_to_all may split unevenly; barrier carries no tensor.
  if (e.op != OpType::kAllToAll && e.op != OpType::kBarrier) {
    s.in_numel = e.input.numel;
    s.out_numel = e.output.numel;
  }
  return s;
}

std::string describe_difference(const Signature& mine, const Signature& theirs) {
  if (mine.op != theirs.op) {
    return fmt::format("called {} where the others called {}", op_name(mine.op),
                       op_name(theirs.op));
  }
  if (mine.reduce_op != theirs.reduce_op) {
    return fmt::format("reduced with {} where the others used {}", reduce_op_text(mine.reduce_op),
                       reduce_op_text(theirs.reduce_op));
  }
  if (mine.root != theirs.root) {
    return fmt::format("broadcast from root {} where the others used root {}", mine.root,
                       theirs.root);
  }
  if (mine.dtype != theirs.dtype) {
    return fmt::format("passed dtype {} where the others passed {}", mine.dtype, theirs.dtype);
  }
  return fmt::format("passed {} input / {} output elements where the others passed {} / {}",
                     mine.in_numel, mine.out_numel, theirs.in_numel, theirs.out_numel);
}

class Analysis {
 public:
  Analysis(const DumpSet& set, const AnalyzerOptions& options) : m_(set, options) {}

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
    v_.status = !v_.culprits.empty()       ? VerdictStatus::kCulpritFound
                : !v_.inconclusive.empty() ? VerdictStatus::kInconclusive
                                           : VerdictStatus::kHealthy;
    return std::move(v_);
  }

 private:
  // Argument mismatches: at each (group, seq) the ranks that disagree with a strict plurality.
  void find_mismatches() {
    for (const auto& [group, by_seq] : m_.aligned()) {
      for (const auto& [key, members] : by_seq) {
        const uint64_t seq = key.first;
        if (members.size() < 2) continue;
        std::map<Signature, std::vector<int>> classes;
        for (const auto& [rank, e] : members) classes[signature_of(*e)].push_back(rank);
        if (classes.size() == 1) continue;
        auto best = classes.begin();
        bool unique = true;
        for (auto it = classes.begin(); it != classes.end(); ++it) {
          if (it->second.size() > best->second.size()) {
            best = it;
            unique = true;
          } else if (it != best && it->second.size() == best->second.size()) {
            unique = false;
          }
        }
        const std::string where = m_.describe_collective(group, seq, *members.front().second);
        if (!unique) {
          std::string split;
          for (const auto& [sig, ranks] : classes) {
            split += fmt::format("; {} {}", ranks_phrase(ranks),
                                 describe_difference(sig, classes.begin()->first));
          }
          v_.inconclusive.push_back(
              fmt::format("arguments of {} differ with no majority to blame{}", where, split));
        } else {
          Finding f;
          f.kind = FindingKind::kMismatch;
          f.group_id = group;
          f.group_name = m_.group_name(group);
          f.seq = seq;
          std::set<int> minority;
          for (const auto& [sig, ranks] : classes) {
            if (sig == best->first) continue;
            minority.insert(ranks.begin(), ranks.end());
            f.details.push_back(
                fmt::format("{} {}", ranks_phrase(ranks), describe_difference(sig, best->first)));
          }
          f.culprits = sorted(minority);
          f.waiting = best->second;
          f.summary = fmt::format("argument mismatch in {}: {} with the other {}", where,
                                  ranks_verb(f.culprits, "disagree"), best->second.size());
          mismatched_.insert({group, seq});
          add_finding(std::move(f));
        }
        break;  // later seqs of a group are unreliable once one mismatched
      }
    }
  }

  // Hangs: who waits for whom, then the culprits at the ends of the waits.
  void find_waits() {
    const auto& waits = m_.waits();  // rank -> what it waits in and on whom
    // Strongly connected components of the wait-for graph (Tarjan, iterative-safe sizes).
    const auto components = m_.wait_cycles();
    std::set<int> in_cycle;
    for (const auto& comp : components) in_cycle.insert(comp.begin(), comp.end());

    for (const auto& comp : components) cycle_finding(comp);

    // Acyclic waits, grouped by the operation waited in.
    std::map<std::tuple<uint64_t, uint64_t, int, int, int>, std::vector<int>> by_op;
    for (const auto& [rank, w] : waits) {
      if (in_cycle.count(rank)) continue;
      const Op& op = w.op;
      by_op[{op.group, op.seq, op.p2p ? op.src : -1, op.p2p ? op.dst : -1, op.p2p}].push_back(rank);
    }
    for (const auto& [key, ranks] : by_op) {
      const auto& w = waits.at(ranks.front());
      if (w.op.p2p) {
        p2p_finding(ranks.front(), w);
      } else {
        collective_finding(ranks, w);
      }
    }
    // Dumps that are missing although nobody waits on them.
    std::vector<int> unexplained;
    for (int r : m_.set().missing_ranks) {
      if (!blamed_.count(r) && !m_.waited_on(r)) unexplained.push_back(r);
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

  void collective_finding(const std::vector<int>& waiting, const internal::Wait& w) {
    const Op& op = w.op;
    const std::string where = m_.describe_collective(op.group, op.seq, *w.entry);
    if (w.missing.empty()) {
      if (!mismatched_.count({op.group, op.seq})) {
        v_.inconclusive.push_back(fmt::format(
            "every member of group '{}' issued {} and it did not complete: look below the "
            "recorder (transport, network, device)",
            m_.group_name(op.group), where));
      }
      return;
    }
    std::vector<int> sinks, compute_only;
    bool others = false;
    for (int s : w.missing) {
      const auto where_s = v_.positions[s].where;
      if (where_s == RankPosition::Where::kInOperation) {
        others = true;
        continue;
      }
      sinks.push_back(s);
      if (where_s == RankPosition::Where::kInCompute) compute_only.push_back(s);
    }
    if (sinks.empty()) return;  // they wait elsewhere; that wait has its own finding
    const std::vector<int> issued = m_.issued(op.group, op.seq);
    Finding f;
    f.group_id = op.group;
    f.group_name = m_.group_name(op.group);
    f.seq = op.seq;
    if (!others && compute_only.size() == w.missing.size() && issued.size() <= w.missing.size()) {
      if (issued.size() == w.missing.size()) {
        v_.inconclusive.push_back(fmt::format(
            "{} in {} while {} never issued it and {} in compute: as many issued it as did "
            "not, so a skipped collective cannot be told from an extra one",
            ranks_verb(issued, "wait"), where, ranks_phrase(w.missing),
            w.missing.size() == 1 ? "is" : "are"));
        return;
      }
      f.kind = FindingKind::kExtraCollective;
      f.culprits = issued;
      f.summary = fmt::format("{} issued {}, which the other {} members never issued",
                              ranks_phrase(issued), where, w.missing.size());
      f.details.push_back(fmt::format("{} {} in compute: {}", ranks_phrase(w.missing),
                                      w.missing.size() == 1 ? "is" : "are",
                                      v_.positions[w.missing.front()].summary));
    } else {
      f.kind = FindingKind::kNotJoined;
      f.culprits = sinks;
      f.waiting = waiting;
      f.summary = fmt::format("{} did not join {}; {} in it", ranks_phrase(sinks), where,
                              ranks_verb(waiting, "wait"));
      for (int s : sinks) f.details.push_back(culprit_detail(s));
    }
    add_finding(std::move(f));
  }

  void p2p_finding(int rank, const internal::Wait& w) {
    const Op& op = w.op;
    if (w.missing.empty()) {
      v_.inconclusive.push_back(fmt::format(
          "{} and its matching {} were both posted and did not complete: look below the "
          "recorder",
          m_.describe_p2p(op), op.src == rank ? "recv" : "send"));
      return;
    }
    if (w.unknown) {
      v_.inconclusive.push_back(fmt::format(
          "{} has no match on rank {}, but that rank's ring no longer holds entries that old",
          m_.describe_p2p(op), w.missing.front()));
      return;
    }
    Finding f;
    const bool is_send = op.src == rank;
    f.kind = is_send ? FindingKind::kUnmatchedSend : FindingKind::kUnmatchedRecv;
    f.group_id = op.group;
    f.group_name = m_.group_name(op.group);
    f.seq = op.seq;
    f.culprits = w.missing;
    f.waiting = {rank};
    f.summary = fmt::format("{} has no matching {}: rank {} never posted it", m_.describe_p2p(op),
                            is_send ? "recv" : "send", w.missing.front());
    f.details.push_back(culprit_detail(w.missing.front()));
    add_finding(std::move(f));
  }

  // A cycle of waits. With an unmatched send/recv in it, the rank that did not post its half is
  // the culprit; otherwise each collective on the cycle blames the side in the minority (both
  // sides on a tie).
  void cycle_finding(const std::vector<int>& comp) {
    const auto& waits = m_.waits();
    const std::set<int> members(comp.begin(), comp.end());
    std::set<int> p2p_blamed;
    for (int r : comp) {
      const auto& w = waits.at(r);
      if (w.op.p2p) {
        for (int s : w.missing) {
          if (members.count(s)) p2p_blamed.insert(s);
        }
      }
    }
    if (!p2p_blamed.empty()) {
      for (int r : comp) {
        const auto& w = waits.at(r);
        if (w.op.p2p && std::any_of(w.missing.begin(), w.missing.end(),
                                    [&](int s) { return p2p_blamed.count(s); })) {
          p2p_finding(r, w);
        }
      }
      return;
    }
    std::set<int> blamed;
    Finding f;
    f.kind = FindingKind::kDeadlock;
    std::set<std::pair<uint64_t, uint64_t>> seen;
    for (int r : comp) {
      const auto& w = waits.at(r);
      if (!seen.insert({w.op.group, w.op.seq}).second) continue;
      const std::vector<int> issued = m_.issued(w.op.group, w.op.seq);
      const auto& missing = w.missing;
      if (missing.size() <= issued.size()) blamed.insert(missing.begin(), missing.end());
      if (issued.size() <= missing.size()) blamed.insert(issued.begin(), issued.end());
      f.details.push_back(fmt::format(
          "{} in {}, which {} never issued", ranks_verb(m_.waiting_in(w.op), "wait"),
          m_.describe_collective(w.op.group, w.op.seq, *w.entry), ranks_phrase(missing)));
      if (f.group_id == 0) {
        f.group_id = w.op.group;
        f.group_name = m_.group_name(w.op.group);
        f.seq = w.op.seq;
      }
    }
    f.culprits = sorted(blamed);
    for (int r : comp) {
      if (!blamed.count(r)) f.waiting.push_back(r);
    }
    f.summary = fmt::format(
        "deadlock across groups: {} wait on each other in a cycle; blamed: "
        "{} (the minority side of each collective on the cycle, both "
        "sides on a tie)",
        ranks_phrase(comp), ranks_phrase(f.culprits));
    add_finding(std::move(f));
  }

  void find_stragglers() {
    const auto stragglers = m_.stragglers();
    if (stragglers.empty()) return;
    const bool hang = !v_.findings.empty() || !v_.inconclusive.empty();
    for (const auto& s : stragglers) {
      const std::string text = fmt::format(
          "rank {} arrived clearly last at {} of the {} collectives with a clear last arrival it "
          "took part in, a median {} after the next latest rank",
          s.rank, s.times_last, s.samples, format_duration(Nanoseconds(s.median_lag_ns)));
      if (hang) {
        v_.notes.push_back("straggler (not blamed while something hangs): " + text);
        continue;
      }
      Finding f;
      f.kind = FindingKind::kStraggler;
      f.culprits = {s.rank};
      f.summary = "straggler: " + text;
      f.details.push_back(culprit_detail(s.rank));
      add_finding(std::move(f));
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
};

}  // namespace

Verdict analyze(const DumpSet& set, const AnalyzerOptions& options) {
  TESSEL_CHECK(!set.dumps.empty(), InvalidArgument,
               "no usable flight-recorder dump to analyze ({} unusable file(s))",
               set.problems.size());
  return Analysis(set, options).run();
}

}  // namespace tessel::fr
