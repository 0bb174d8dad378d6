#pragma once
// What the analyzer keeps of the dumps: per rank, a bounded window of its newest entries in
// compact form (each call's arguments interned once), and summaries of its whole ring that the
// rules read; across ranks, one alignment record per collective (group, seq) with the members'
// calls and arrival times. Built while the dumps are parsed (dump_stream.h), so a thousand full
// rings are analyzed without holding their entries.
//
// The window, per (rank, group): the kHeldPerGroup newest operations, plus the group's oldest
// unfinished operation and its newest finished one. Collectives of one group synchronise its
// members, so where a rank is (the operation it waits in, the one it finished last) lies at the
// end of each group's history, and everything older reaches the rules as a summary:
//   - how far the rank got in each group (highest seq), and which send/recv it posted per
//     channel (runs of p2p seqs);
//   - its count of collectives per training step per group (runs of equal counts), for the
//     step-rhythm evidence;
//   - its failed operations, its newest user event, its ring's size and oldest timestamp;
//   - per (group, seq, coalesced index), across ranks: the distinct calls made there and which
//     members made each (a bit per member), and the latest two arrivals, for argument
//     mismatches and stragglers anywhere in the rings.
// The one rule that may need an entry outside the window (the order in which ranks issued two
// operations of a deadlock cycle) reads it again from the dump (collective_at).
//
// Not thread-safe after construction except where a method says so; the DumpSet a digest is
// made from must outlive it.

#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessel/flight_recorder/reader.h"

namespace tessel::fr::internal {

// Operations held per (rank, group) beyond the pinned two. Deadlock-order votes of ranks up to
// this many operations of a group past a cycle are answered without reading a dump again; a
// ring holds 4,096 entries by default, so this is 1/64 of a ring with one group.
inline constexpr size_t kHeldPerGroup = 64;

// A collective's position in its group: (seq, coalesced index), as ops of one coalesced batch
// share a seq on some backends.
using SeqKey = std::pair<uint64_t, uint32_t>;

// The arguments of one call, shared by every entry that made the same call.
struct Call {
  OpType op = OpType::kAllReduce;
  std::optional<ReduceOp> reduce_op;
  int32_t root = -1;
  TensorMeta input, output;
  std::string text;     // split: the new group's name; send/recv: a ScopedRecordText's
  std::string purpose;  // the issuing thread's ThreadScope ("" for the training loop's)
  bool operator==(const Call& o) const;
};

// An operation as the analyzer holds it. User events are not held (RankDigest::last_event),
// nor are spans (counted in RankDigest::entries; open ones kept in RankDigest::open_spans).
struct HeldEntry {
  uint64_t record_id = 0, group_id = 0, seq = 0, p2p_seq = 0;
  int64_t step = -1, enqueued_ns = 0, completed_ns = 0;
  uint32_t index = 0;  // position in the rank's ring, oldest first
  uint32_t call = 0;   // Digest::call
  uint32_t coalesced_index = 0;
  int32_t peer = -1;
  OpType op = OpType::kAllReduce;
  EntryState state = EntryState::kScheduled;

  bool is_p2p() const { return op == OpType::kSend || op == OpType::kRecv; }
  bool is_collective() const { return !is_p2p(); }
  bool finished() const { return state == EntryState::kCompleted || state == EntryState::kFailed; }
};

// Consecutive training steps [first, last] in each of which a rank issued `count` collectives.
struct StepRun {
  int64_t first = 0, last = 0, count = 0;
};
// The count a run list gives `step` (0 when none).
int64_t count_at(const std::vector<StepRun>& runs, int64_t step);
// Two run lists added step by step (a rank's groups of one family).
std::vector<StepRun> add_runs(const std::vector<StepRun>& a, const std::vector<StepRun>& b);

// What one rank's ring says about one group.
struct GroupHistory {
  uint64_t group = 0;
  bool collectives = false;    // the ring has a collective of this group
  uint64_t reached = 0;        // the highest collective seq
  std::vector<StepRun> steps;  // collectives that carry a step
  // For lookups outside the window: the oldest collective's key in the ring, the oldest in
  // the window, whether keys rose along the ring, and how many the ring and the window hold.
  SeqKey oldest{}, oldest_held{};
  bool ordered = true;
  uint64_t in_ring = 0, in_window = 0;
};

// Posted p2p seqs [first, last] of one channel: `peer` is the peer's index in the group.
struct P2pRun {
  uint64_t group = 0;
  int32_t peer = -1;
  bool send = false;
  uint64_t first = 0, last = 0;
};

struct FailedOp {
  uint64_t group = 0, seq = 0;  // p2p: the p2p seq
  OpType op = OpType::kAllReduce;
};

// One rank's dump as the analyzer keeps it.
struct RankDigest {
  std::vector<HeldEntry> held;       // ring order
  std::vector<GroupHistory> groups;  // in the order its ring first gave them a stepped collective
  std::vector<P2pRun> p2p;
  std::vector<FailedOp> failed;
  std::vector<const GroupInfo*> registered;  // the groups its dump registers, by id
  std::string last_event;                    // its newest user event's text
  // Spans of the training loop's threads (no ThreadScope) still open at the dump, in ring order
  // (outermost first when nested): the compute it is in ("F mb1 s1", the pipeline's action).
  struct OpenSpan {
    std::string text;
    int64_t started_ns = 0;
  };
  std::vector<OpenSpan> open_spans;
  uint64_t entries = 0;            // entries in its ring, user events and spans too
  int64_t oldest_enqueued_ns = 0;  // its oldest entry's

  const GroupHistory* history(uint64_t group) const;
};

// The members' entries at one (group, seq, coalesced index).
struct Alignment {
  // The members that made one call: a bit per position in GroupAlignment::ranks, and `strays`
  // for ranks the group's registration does not list.
  struct Class {
    uint32_t call = 0;
    int32_t first_rank = -1;  // its lowest rank, and the step of that rank's entry
    int64_t first_step = -1;
    std::vector<uint64_t> bits;
    std::vector<int32_t> strays;
  };
  std::vector<Class> classes;
  uint32_t count = 0;     // entries aligned here
  bool completed = true;  // all of them completed
  // Arrivals on the wall clock (ns): the latest, and the latest before it.
  int64_t last_at = INT64_MIN, second_at = INT64_MIN;
  int64_t last_done = 0, last_waited = 0;  // the latest arrival's completion; its previous wait
  int32_t last_rank = -1;
};

struct SeqKeyHash {
  size_t operator()(const SeqKey& k) const { return k.first * 0x9E3779B97F4A7C15ull ^ k.second; }
};

struct GroupAlignment {
  std::vector<int> ranks;  // sorted members, as first registered
  std::unordered_map<SeqKey, Alignment, SeqKeyHash> keys;
};

// One call made at an aligned (group, seq) and the ranks that made it (sorted).
struct MemberClass {
  uint32_t call = 0;
  int first_rank = -1;
  int64_t first_step = -1;
  std::vector<int> ranks;
};

class Digest {
 public:
  // Digests a set read whole; the set must outlive the digest.
  explicit Digest(const DumpSet& set);
  // Reads the dumps of `dir` by read_dump_dir's rules, digesting each as it is parsed. The
  // set it keeps has no entries, and no groups (RankDigest::registered has them, shared).
  static std::unique_ptr<Digest> read(const std::filesystem::path& dir, int world_size_hint);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  const DumpSet& set() const { return *set_; }
  // Parallel to set().dumps.
  const RankDigest& rank_digest(size_t dump) const { return ranks_[dump]; }
  const Call& call(uint32_t id) const { return calls_[id]; }
  const std::unordered_map<uint64_t, GroupAlignment>& alignments() const { return aligned_; }
  // The calls made at (group, key), each with its ranks, by call id; empty when none.
  std::vector<MemberClass> classes(uint64_t group, const SeqKey& key) const;
  // Entries held across all ranks (the window's measure, for tests).
  size_t held_entries() const;

  // Collective `seq` (coalesced index 0) of `group` in dump `dump`'s ring: its record id and
  // whether it finished, from the window or, outside it, read again from the dump; nullopt
  // when the ring holds none. prefetch() reads many at once, in parallel.
  struct Found {
    uint64_t record_id = 0;
    bool finished = false;
  };
  using Lookup = std::tuple<size_t, uint64_t, uint64_t>;  // dump, group, seq
  std::optional<Found> collective_at(size_t dump, uint64_t group, uint64_t seq) const;
  void prefetch(const std::vector<Lookup>& lookups) const;

 private:
  friend class RankFold;
  Digest() = default;
  bool needs_fetch(size_t dump, uint64_t group, uint64_t seq) const;
  // The shared id of a call; the caller holds mutex_.
  uint32_t intern(const Call& call);
  // The shared copy of a group registration (one per distinct registration); locks mutex_.
  const GroupInfo* share(GroupInfo&& group);

  const DumpSet* set_ = nullptr;
  std::unique_ptr<DumpSet> owned_;            // read(): the headers
  std::vector<std::filesystem::path> files_;  // read(): each dump's file
  std::vector<RankDigest> ranks_;
  std::vector<Call> calls_;
  std::unordered_map<size_t, std::vector<uint32_t>> call_ids_;  // hash -> ids
  std::deque<GroupInfo> groups_;
  std::unordered_map<uint64_t, std::vector<const GroupInfo*>> group_ids_;
  std::unordered_map<uint64_t, GroupAlignment> aligned_;
  std::mutex mutex_;  // guards the above while dumps are read in parallel
  mutable std::map<Lookup, std::optional<Found>> fetched_;
};

// Folds one dump's entries, oldest first, into what a Digest keeps (RankDigest and the
// alignment records). Not thread-safe; folds of different dumps may run at once.
class RankFold {
 public:
  explicit RankFold(Digest& digest) : digest_(digest) {}
  void fold(const TraceEntry& e);
  // The dump's header (its entries are ignored); merges into the digest under its lock.
  RankDigest finish(const RankDump& dump, std::vector<const GroupInfo*> registered);
  // Entries held so far, for tests.
  size_t held() const;

 private:
  struct Group {
    GroupHistory history;
    std::vector<HeldEntry> window;  // circular: the newest kHeldPerGroup
    size_t next = 0;
    std::optional<HeldEntry> oldest_unfinished, newest_finished;
    std::vector<std::pair<int64_t, int64_t>> steps;  // (step, count) in ring order
    SeqKey newest{};                                 // the newest collective's key
    uint32_t first_stepped = UINT32_MAX;
  };
  // A collective's contribution to its alignment record (times still on the rank's clock).
  struct Arrival {
    uint64_t group, seq;
    uint32_t coalesced_index, call;
    int64_t step, enqueued_ns, completed_ns, waited_ns;
    EntryState state;
  };
  Group& group(uint64_t id);
  uint32_t local_call(const TraceEntry& e);

  Digest& digest_;
  std::vector<Group> groups_;
  std::unordered_map<uint64_t, size_t> group_index_;
  std::vector<Call> calls_;  // interned per dump, shared at finish
  std::unordered_map<size_t, std::vector<uint32_t>> call_ids_;
  std::vector<Arrival> arrivals_;
  std::vector<P2pRun> p2p_;
  std::vector<FailedOp> failed_;
  std::string last_event_;
  std::vector<RankDigest::OpenSpan> open_spans_;
  uint32_t index_ = 0;
  int64_t previous_wait_ns_ = 0;
  int64_t oldest_enqueued_ns_ = 0;
};

}  // namespace tessel::fr::internal
