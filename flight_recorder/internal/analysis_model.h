#pragma once
// The facts the analyzer reasons over, computed once from a Digest (dump_digest.h): entries
// aligned by (group, seq), how far each rank got in each group, the operation each rank is
// blocked in and the ranks it waits for, cycles among those waits, who is dead or crashed, which
// ranks broke the per-step rhythm of collectives that the other members kept, and arrival
// statistics for stragglers.
//
// Sibling groups: groups with the same name and size (the groups of one mesh dimension, or of
// one split given a name) run the same program, so their collectives at the same seq, and their
// counts of collectives per training step, are evidence about each other.
//
// Not thread-safe; borrows the Digest, which must outlive it.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessel/flight_recorder/analyzer.h"
#include "tessel/flight_recorder/internal/dump_digest.h"

namespace tessel::fr::internal {

// An operation as the analyzer names it: a collective (group, seq) or one direction of a
// point-to-point channel (group, src -> dst global ranks, p2p seq).
struct Op {
  uint64_t group = 0;
  uint64_t seq = 0;
  bool p2p = false;
  int src = -1, dst = -1;
  bool operator==(const Op& o) const {
    return std::tie(group, seq, p2p, src, dst) == std::tie(o.group, o.seq, o.p2p, o.src, o.dst);
  }
  bool operator<(const Op& o) const {
    return std::tie(group, seq, p2p, src, dst) < std::tie(o.group, o.seq, o.p2p, o.src, o.dst);
  }
};

// A rank blocked in `op` (its oldest operation that has not finished), and the ranks that have
// not issued their part of it (sorted). `unknown`: the peer's ring no longer reaches back far
// enough to say whether it posted the matching send/recv.
struct Wait {
  Op op;
  const HeldEntry* entry = nullptr;
  std::vector<int> missing;
  bool unknown = false;
};

// A rank whose count of collectives on a family of sibling groups, in one completed training
// step, differs from what the other members issued in that step.
struct StepDeviation {
  int rank = -1;
  std::string family;  // the groups' name
  int64_t step = -1;
  int64_t count = 0;    // what the rank issued
  int64_t norm = 0;     // what the majority issued
  size_t agreeing = 0;  // ranks that issued `norm`
  // Settled by the rank's own rhythm (no majority among ranks): it issued `norm` in each of its
  // `agreeing` other finished steps, and the other side kept its own rhythm in this step.
  bool own_rhythm = false;
  // A member of the rank's own group (not only of a sibling group) issued a different count in
  // that step: the deviation broke its group's program, whatever the siblings do.
  bool in_group = false;
};

struct StragglerStats {
  int rank = -1;
  size_t samples = 0, times_last = 0;
  int64_t median_lag_ns = 0;       // how much later than the next latest rank it arrived
  int64_t median_duration_ns = 0;  // the collectives' own duration once every rank was there
};

class Model {
 public:
  Model(const Digest& digest, const AnalyzerOptions& options);

  const DumpSet& set() const { return digest_.set(); }
  int world_size() const { return world_size_; }
  const Call& call(uint32_t id) const { return digest_.call(id); }
  const std::map<int, Wait>& waits() const { return waits_; }
  const std::vector<std::string>& notes() const { return notes_; }

  // (group, key) where members made different calls, by group then key.
  std::vector<std::pair<uint64_t, SeqKey>> contested() const;
  // The calls made at collective `key` of `group`, each with the members that made it.
  std::vector<MemberClass> members(uint64_t group, const SeqKey& key) const {
    return digest_.classes(group, key);
  }
  // The same for each sibling group at `key`, in family order.
  std::vector<std::vector<MemberClass>> sibling_members(uint64_t group, const SeqKey& key) const;

  RankPosition position(int rank) const;
  // Non-trivial strongly connected components of the wait-for graph, each sorted.
  std::vector<std::vector<int>> wait_cycles() const;
  // Members of `group` whose dump shows they issued collective `seq` (sorted).
  std::vector<int> issued(uint64_t group, uint64_t seq) const;
  std::vector<int> waiting_in(const Op& op) const;
  // Distinct operations some rank waits in that `rank` has not issued.
  std::set<Op> waited_on_in(int rank) const;
  bool waited_on(int rank) const { return !waited_on_in(rank).empty(); }
  std::vector<StragglerStats> stragglers() const;

  // A member that issued a collective only after other members had given up waiting in it (their
  // entry failed after waiting at least the analyzer's min_wait): it did not join in time.
  // Or one that issued it in time but failed in it long after the others gave up, having waited
  // far longer than they did (stalled_inside: it was stopped or descheduled inside it).
  struct LateArrival {
    Op op;
    const HeldEntry* entry = nullptr;  // the late rank's entry for op
    std::vector<int> gave_up;          // the members that had given up before it came
    int64_t late_ns = 0;  // its arrival (stalled_inside: its failure) after the first give-up
    bool stalled_inside = false;
  };
  const std::map<int, LateArrival>& late() const { return late_; }

  // Liveness from the dumps and the launcher's exit record.
  // Its dump was written by a fatal-signal handler before any of its operations failed: a crash.
  // A rank that died of a signal after an operation of its own failed (an uncaught Timeout's
  // std::terminate, abort() in a handler) is a victim of that failure, not a crash
  // (aborted_after_failure), and is taken as waiting in the failed operation.
  bool crashed(int rank) const;
  bool aborted_after_failure(int rank) const;
  // Its dump was recovered from its ring after the launcher saw it exit by itself (a status, no
  // signal): it left, it did not crash.
  bool exited_with_ring(int rank) const;
  bool exited_cleanly(int rank) const;  // no dump, and the launcher saw it exit with status 0
  bool dead(int rank) const;            // no dump (and not a clean exit), crashed, or stale
  std::string death(int rank) const;    // "crashed (SIGSEGV)", "killed by SIGKILL", ...
  // The operation a crashed rank was in when it died (null when it was in compute).
  const HeldEntry* crash_op(int rank) const;

  // Sibling evidence for collective `seq` of `group`: members of the sibling groups (with a
  // dump) and how many of them issued a collective with that seq.
  struct SiblingProgress {
    size_t members = 0, reached = 0;
  };
  SiblingProgress sibling_progress(uint64_t group, uint64_t seq) const;
  bool has_siblings(uint64_t group) const;
  // Earliest per-step deviation of each rank, by rank; only those its own group's members
  // contradict (StepDeviation::in_group).
  const std::map<int, StepDeviation>& deviations() const { return deviations_; }
  // Which of two operations the ranks that issue both (or their siblings' equivalents) issue
  // first: the votes for `a` first and for `b` first.
  std::pair<size_t, size_t> order_votes(const Op& a, const Op& b) const;
  // Whether `rank` issued collective `op`, or the one with its seq in the rank's own group of
  // op's family (a sibling group's counterpart).
  bool issued_counterpart(int rank, const Op& op) const;
  // How `rank` ordered, in its earlier training steps, the counterparts of collectives `a` and
  // `b`: the collectives at the same place within a step (the k-th of their group in it) as
  // `ea`, the rank's own entry for a, and `eb`, the entry of rank `b_rank` for b. Steps its
  // ring holds in full only; {0, 0} when the entries carry no step.
  std::pair<size_t, size_t> past_order(int rank, const Op& a, const HeldEntry& ea, int b_rank,
                                       const Op& b, const HeldEntry& eb) const;
  // `rank`'s own half (its send or its recv) of channel `op` with p2p seq `seq`, from its ring;
  // null when the ring does not hold it.
  const HeldEntry* p2p_entry(int rank, const Op& op, uint64_t seq) const;

  std::string group_name(uint64_t group) const;
  // The members of the group named `name` that `rank`'s dump registers with `rank` among them
  // (what a split of that name made there); empty when the dump registers none.
  std::vector<int> made_group(int rank, std::string_view name) const;
  // `rank`'s entries as its ring holds them (null without a dump), and a group's registration
  // (null when no dump registers it).
  const std::vector<HeldEntry>* held(int rank) const {
    const Dump* d = dump_of(rank);
    return d == nullptr ? nullptr : &d->digest->held;
  }
  const GroupInfo* group_info(uint64_t group) const {
    const auto it = groups_.find(group);
    return it == groups_.end() ? nullptr : it->second;
  }
  std::string describe_collective(uint64_t group, uint64_t seq, const Call& call,
                                  int64_t step) const;
  std::string describe_collective(uint64_t group, uint64_t seq, const HeldEntry& e) const {
    return describe_collective(group, seq, call(e.call), e.step);
  }
  // "send #3 from rank 1 to rank 2 in group 'tp'" or, seen from the receiver, "recv #3 at rank
  // 2 from rank 1 in group 'tp'".
  // "recv #2 at rank 1 from rank 0 in group 'g'", followed by the entry's text in parentheses
  // when it has one (a pipeline action: "(pipeline RECV_F1s1<0: mb 1, stage 1)").
  std::string describe_p2p(const Op& op, bool as_recv = false,
                           const HeldEntry* entry = nullptr) const;
  std::string describe_deviation(const StepDeviation& d) const;

 private:
  // A rank's dump and what the digest keeps of it.
  struct Dump {
    size_t index = 0;  // in set().dumps
    const RankDump* header = nullptr;
    const RankDigest* digest = nullptr;
  };
  const Dump* dump_of(int rank) const {
    return rank >= 0 && rank < world_size_ && by_rank_[rank].header != nullptr ? &by_rank_[rank]
                                                                               : nullptr;
  }
  uint64_t reached(int rank, uint64_t group) const;
  std::string family_of(uint64_t group) const;
  bool member_of(int rank, uint64_t group) const;
  void index_dump(const Dump& d);
  void find_wait(const Dump& d);
  // Whether a member `e` needs is known to be gone: it crashed, or the launcher recorded its
  // exit and it left no dump. Such an operation waits, however young: it cannot complete.
  bool needs_gone_rank(int rank, const HeldEntry& e) const;
  void find_deviations();
  // Moves the members that issued a collective after others gave up on it from waiting in it to
  // being awaited by the others (late_).
  void find_late_arrivals();
  // The entry `rank` recorded for collective `seq` of `group` (or of a sibling group the rank
  // belongs to), nullopt when none.
  std::optional<Digest::Found> entry_at(int rank, const std::string& family, uint64_t seq) const;

  const Digest& digest_;
  const AnalyzerOptions options_;
  int world_size_ = 0;
  int64_t threshold_ns_ = 0;
  int64_t newest_wall_us_ = 0;
  std::vector<Dump> by_rank_;
  std::vector<bool> stale_;
  std::map<int, const ExitRecord*> exits_;
  std::unordered_map<uint64_t, const GroupInfo*> groups_;
  std::map<std::string, std::vector<uint64_t>> families_;        // family -> group ids
  std::vector<std::unordered_map<uint64_t, uint64_t>> reached_;  // rank -> group -> max seq
  std::vector<std::unordered_map<uint64_t, uint64_t>> dropped_;  // rank -> group -> count
  // (group, src, dst, is_send) -> runs of p2p seqs any rank recorded on that channel.
  std::map<std::tuple<uint64_t, int, int, bool>, std::vector<std::pair<uint64_t, uint64_t>>>
      posted_;
  std::map<int, Wait> waits_;
  std::map<int, LateArrival> late_;
  std::map<int, StepDeviation> deviations_;
  std::map<std::tuple<uint64_t, uint64_t, std::string>, std::vector<int>> failed_;
  std::vector<std::string> notes_;
};

}  // namespace tessel::fr::internal
