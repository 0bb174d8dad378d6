#pragma once
// The facts the analyzer reasons over, computed once from a DumpSet: entries aligned by
// (group, seq), how far each rank got in each group, the operation each rank is blocked in and
// the ranks it waits for, cycles among those waits, and arrival statistics for stragglers.
//
// Not thread-safe; borrows the DumpSet, which must outlive it.

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessel/flight_recorder/analyzer.h"

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
};

// A rank blocked in `op` (its oldest operation that has not finished), and the ranks that have
// not issued their part of it (sorted). `unknown`: the peer's ring no longer reaches back far
// enough to say whether it posted the matching send/recv.
struct Wait {
  Op op;
  const TraceEntry* entry = nullptr;
  std::vector<int> missing;
  bool unknown = false;
};

struct StragglerStats {
  int rank = -1;
  size_t samples = 0, times_last = 0;
  int64_t median_lag_ns = 0;
};

class Model {
 public:
  // group -> (seq, coalesced_index) -> (rank, entry): ops of one coalesced batch share a seq
  // on some backends, so the index inside the batch is part of the key.
  using SeqKey = std::pair<uint64_t, uint32_t>;
  using Aligned =
      std::map<uint64_t, std::map<SeqKey, std::vector<std::pair<int, const TraceEntry*>>>>;

  Model(const DumpSet& set, const AnalyzerOptions& options);

  const DumpSet& set() const { return set_; }
  int world_size() const { return world_size_; }
  const Aligned& aligned() const { return aligned_; }
  const std::map<int, Wait>& waits() const { return waits_; }
  const std::vector<std::string>& notes() const { return notes_; }

  RankPosition position(int rank) const;
  // Non-trivial strongly connected components of the wait-for graph, each sorted.
  std::vector<std::vector<int>> wait_cycles() const;
  // Members of `group` whose dump shows they issued collective `seq` (sorted).
  std::vector<int> issued(uint64_t group, uint64_t seq) const;
  std::vector<int> waiting_in(const Op& op) const;
  bool waited_on(int rank) const;
  std::vector<StragglerStats> stragglers() const;

  std::string group_name(uint64_t group) const;
  std::string describe_collective(uint64_t group, uint64_t seq, const TraceEntry& e) const;
  std::string describe_p2p(const Op& op) const;

 private:
  const RankDump* dump_of(int rank) const {
    return rank >= 0 && rank < world_size_ ? by_rank_[rank] : nullptr;
  }
  uint64_t reached(int rank, uint64_t group) const;
  void index_dump(const RankDump& d);
  void find_wait(const RankDump& d);

  const DumpSet& set_;
  const AnalyzerOptions options_;
  int world_size_ = 0;
  int64_t threshold_ns_ = 0;
  int64_t newest_wall_us_ = 0;
  std::vector<const RankDump*> by_rank_;
  std::vector<bool> stale_;
  std::unordered_map<uint64_t, const GroupInfo*> groups_;
  std::vector<std::unordered_map<uint64_t, uint64_t>> reached_;  // rank -> group -> max seq
  std::vector<std::unordered_map<uint64_t, uint64_t>> dropped_;  // rank -> group -> count
  Aligned aligned_;
  // (group, src, dst, p2p seq, is_send) of every send/recv any rank recorded.
  std::set<std::tuple<uint64_t, int, int, uint64_t, bool>> posted_;
  std::map<int, Wait> waits_;
  std::map<std::tuple<uint64_t, uint64_t, std::string>, std::vector<int>> failed_;
  std::vector<std::string> notes_;
};

}  // namespace tessel::fr::internal
