#pragma once
// The analyzer: reads every rank's dump together and names the ranks that hang the job and why.
// It aligns collectives by (group, sequence number) and send/recv by (group, sender, receiver,
// per-peer sequence number), works out where each rank is (waiting in which operation, in
// compute after which one, crashed, dead with no dump, exited, stale), and reports findings:
//   - not_joined: ranks waiting in a collective that some members never issued; the members
//     that are in compute, dead, exited or stale are the culprits;
//   - crashed: a rank whose dump was written by its fatal-signal handler, which the others wait
//     for (in a collective it never issued, or one it was in when it died);
//   - extra_collective: a minority issued a collective the rest never did (they are all in
//     compute or exited); the minority is the culprit;
//   - mismatch: ranks called the same (group, seq) with different op, reduce op, root, dtype or
//     size; the minority is blamed, counting the members of sibling groups (the other groups of
//     the same mesh dimension) at the same seq;
//   - unmatched_send / unmatched_recv: a send (recv) whose peer never posted the matching recv
//     (send); the peer that did not post it and went on is the culprit (a peer blocked in a
//     send/recv of its own, further down a ring, waits: it is not);
//   - deadlock: a cycle in the wait-for graph (rank A waits in an op that rank B never issued
//     because B waits in one A never issued); blamed are the ranks the evidence singles out:
//     those whose count of collectives in a training step differs from their siblings', else
//     those that changed the order they kept in their earlier steps, else those that issued
//     the cycle's operations in the order fewer ranks used.
// Evidence that settles a two-sided wait (a skipped collective or an extra one; which side of a
// cycle deviated): step stamps (per-step counts of collectives on sibling groups), whether the
// sibling groups reached the collective, a rank that several groups wait on, the fatal-signal
// trigger of a dump, and the launcher's record of which ranks exited. When nothing separates the
// two sides, the verdict says so in words and names the suspects, and blames nobody.
// Stragglers (a rank clearly last at most collectives, beyond a threshold relative to the
// collectives' own duration) are information: they never make a verdict other than healthy.
// A rank that merely waits is never a culprit.
//
// Thread-safe: pure functions of their inputs.

#include <chrono>
#include <cstdint>
#include <filesystem>
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
  // Straggler (information only): at a completed collective, the last rank to arrive counts
  // as late when it came at least max(straggler_min_lag, straggler_duration_factor x the
  // collective's own duration) after the next latest rank, and its compute before it was that
  // much longer than the others'. A rank late at `straggler_min_samples` or more collectives,
  // and at this fraction or more of those it took part in, is reported.
  double straggler_fraction = 0.6;
  size_t straggler_min_samples = 5;
  std::chrono::nanoseconds straggler_min_lag = std::chrono::milliseconds(20);
  double straggler_duration_factor = 2.0;
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
  kCrashed,
};
std::string_view finding_kind_name(FindingKind kind);  // "not_joined", "deadlock", ...

// Where one rank is at the time of its dump.
struct RankPosition {
  // kLate: it issued the operation the others gave up waiting in only after they had.
  enum class Where { kInOperation, kInCompute, kNoDump, kStale, kCrashed, kExited, kLate };
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
  uint64_t group_id = 0;      // the collective or channel concerned
  std::string group_name;
  uint64_t seq = 0;                  // collective seq, or p2p seq for send/recv
  std::string summary;               // one line
  std::vector<std::string> details;  // where each culprit is, what differed, ...
};

// A rank that arrives clearly last at most collectives of a job that does not hang.
struct Straggler {
  int rank = -1;
  size_t late = 0, samples = 0;
  std::chrono::nanoseconds median_lag{0}, median_duration{0};
  std::string summary;
};

struct Verdict {
  VerdictStatus status = VerdictStatus::kHealthy;
  std::vector<int> culprits;  // union of the findings' culprits, sorted
  std::vector<Finding> findings;
  std::vector<std::string> inconclusive;  // reasons the evidence was not enough
  // Inconclusive: ranks among which the evidence says the fault lies, without telling which
  // (both sides of a symmetric wait). Never blamed.
  std::vector<int> suspects;
  std::vector<Straggler> stragglers;    // information, never a culprit
  std::vector<std::string> notes;       // context that blames nobody (failed ops, problems)
  std::vector<RankPosition> positions;  // one per rank of the world, by rank
  int world_size = 0;
  int dumps = 0;
};

// Analyzes a set of dumps. Never throws on odd content (it becomes notes or inconclusive);
// throws InvalidArgument only when `set` has no dump at all.
Verdict analyze(const DumpSet& set, const AnalyzerOptions& options = {});

// The dumps of a directory and their verdict.
struct DirAnalysis {
  // Which dumps were read and what was wrong with the rest, as read_dump_dir says; the dumps
  // keep neither their entries nor their groups.
  DumpSet set;
  Verdict verdict;  // of the usable dumps; default (world_size 0) when there is none
};
// analyze(read_dump_dir(dir, world_size_hint), options) while the dumps are read: per rank it
// keeps only a window of each group's newest entries and summaries of the rest (internal/
// dump_digest.h), so memory does not grow with the rings' capacity. The same verdict. Throws as
// read_dump_dir.
DirAnalysis analyze_dump_dir(const std::filesystem::path& dir, const AnalyzerOptions& options = {},
                             int world_size_hint = -1);

// The verdict for people: status line, findings with details, then where ranks are (ranks in
// the same place folded together: "ranks 0-2,4-7: waiting in all_reduce ...").
std::string format_verdict(const Verdict& verdict);
// The verdict as JSON (schema in docs/flight-recorder.md).
std::string verdict_to_json(const Verdict& verdict);

// "0-2,4,6-9": sorted ranks as ranges.
std::string format_rank_list(const std::vector<int>& ranks);

}  // namespace tessel::fr
