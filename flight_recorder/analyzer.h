#pragma once
// The analyzer: reads every rank's dump together and names the ranks that hang the job and why.
// It aligns collectives by (group, sequence number) and send/recv by (group, sender, receiver,
// per-peer sequence number), works out where each rank is (waiting in which operation, in
// compute after which one, dead with no dump, stale), and reports findings:
//   - not_joined: ranks waiting in a collective that some members never issued; the members
//     that are in compute, dead or stale are the culprits (the minority rule below applies);
//   - extra_collective: a minority issued a collective the rest never did (they are all in
//     compute); the minority is the culprit;
//   - mismatch: ranks called the same (group, seq) with different op, reduce op, root, dtype or
//     size; the minority is blamed (no strict majority: inconclusive);
//   - unmatched_send / unmatched_recv: a send (recv) whose peer never posted the matching recv
//     (send); the peer that did not post it is the culprit;
//   - deadlock: a cycle in the wait-for graph (rank A waits in an op that rank B never issued
//     because B waits in one A never issued); the ranks on the cycle are the culprits;
//   - straggler: a rank last to arrive at most collectives by a clear margin (reported as a
//     culprit only when nothing hangs);
// and "inconclusive" with the reason when the evidence is not enough. A rank is blamed only by
// a finding; a rank that merely waits is never a culprit.
//
// Thread-safe: pure functions of their inputs.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tessel/flight_recorder/reader.h"

namespace tessel::fr {

struct AnalyzerOptions {
  // An operation pending for less than this at its rank's dump is in flight, not hung (so a
  // dump of a live job blames nobody). Ignored (treated as 0) when any dump's trigger is
  // "timeout": the watchdog already decided the job hangs.
  std::chrono::nanoseconds min_wait = std::chrono::seconds(1);
  // A dump written this much before the newest one is stale: its rank stopped answering.
  std::chrono::nanoseconds stale_after = std::chrono::seconds(60);
  // Straggler: clearly last (at least `straggler_min_lag` after the next latest rank) at
  // `straggler_min_samples` or more fully aligned collectives, and at this fraction or more of
  // the clearly-ended collectives it took part in.
  double straggler_fraction = 0.6;
  size_t straggler_min_samples = 5;
  std::chrono::nanoseconds straggler_min_lag = std::chrono::milliseconds(5);
};

enum class VerdictStatus { kHealthy, kCulpritFound, kInconclusive };
std::string_view verdict_status_name(VerdictStatus status);  // "healthy", "culprit_found", ...

enum class FindingKind {
  kNotJoined,
  kExtraCollective,
  kMismatch,
  kUnmatchedSend,
  kUnmatchedRecv,
  kDeadlock,
  kStraggler,
};
std::string_view finding_kind_name(FindingKind kind);  // "not_joined", "deadlock", ...

// Where one rank is at the time of its dump.
struct RankPosition {
  enum class Where { kInOperation, kInCompute, kNoDump, kStale };
  int rank = -1;
  Where where = Where::kNoDump;
  std::string summary;     // "waiting in all_reduce #42 of group 'world' (...) for 31.2s"
  std::string place;       // the summary without durations, for folding ranks together
  std::string last_event;  // text of the rank's last user event ("" when none)
  int64_t step = -1;       // step in the dump (-1 unknown)
};
std::string_view where_name(RankPosition::Where where);  // "in_operation", "in_compute", ...

struct Finding {
  FindingKind kind = FindingKind::kNotJoined;
  std::vector<int> culprits;  // sorted global ranks this finding blames
  std::vector<int> waiting;   // ranks stuck because of it (not blamed)
  uint64_t group_id = 0;      // the collective or channel concerned (0 for stragglers)
  std::string group_name;
  uint64_t seq = 0;                  // collective seq, or p2p seq for send/recv
  std::string summary;               // one line
  std::vector<std::string> details;  // where each culprit is, what differed, ...
};

struct Verdict {
  VerdictStatus status = VerdictStatus::kHealthy;
  std::vector<int> culprits;  // union of the findings' culprits, sorted
  std::vector<Finding> findings;
  std::vector<std::string> inconclusive;  // reasons the evidence was not enough
  std::vector<std::string> notes;         // context that blames nobody (failed ops, problems)
  std::vector<RankPosition> positions;    // one per rank of the world, by rank
  int world_size = 0;
  int dumps = 0;
};

// Analyzes a set of dumps. Never throws on odd content (it becomes notes or inconclusive);
// throws InvalidArgument only when `set` has no dump at all.
Verdict analyze(const DumpSet& set, const AnalyzerOptions& options = {});

// The verdict for people: status line, findings with details, then where ranks are (ranks in
// the same place folded together: "ranks 0-2,4-7: waiting in all_reduce ...").
std::string format_verdict(const Verdict& verdict);
// The verdict as JSON (schema in docs/flight-recorder.md).
std::string verdict_to_json(const Verdict& verdict);

// "0-2,4,6-9": sorted ranks as ranges.
std::string format_rank_list(const std::vector<int>& ranks);

}  // namespace tessel::fr
