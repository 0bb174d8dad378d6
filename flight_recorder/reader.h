#pragma once
// Reading flight-recorder dumps back: one file (read_dump) or a directory with one file per rank
// (read_dump_dir). Bad input never crashes: a file that is not a valid dump of the supported
// version gives tessel::Error (InvalidArgument, or IoError when it cannot be read) whose message
// names the file, the field and the problem.
//
//   DumpSet set = read_dump_dir("/tmp/tessel_fr");
//   for (const auto& p : set.problems) std::cerr << p.path << ": " << p.message << "\n";
//
// Thread-safe: free functions over their own data.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel::fr {

// One entry as read from a dump. Times are the rank's monotonic nanoseconds (0 = not yet);
// RankDump::to_wall_ns puts them on wall time, comparable across ranks.
struct TraceEntry {
  uint64_t record_id = 0;
  uint64_t group_id = 0;
  uint64_t seq = 0;
  int32_t peer = -1;  // send/recv: the peer's rank within the group
  uint64_t p2p_seq = 0;
  OpType op = OpType::kAllReduce;
  std::optional<ReduceOp> reduce_op;
  EntryState state = EntryState::kScheduled;
  int32_t root = -1;
  uint32_t coalesced_id = 0, coalesced_index = 0, callsite_id = 0;
  int64_t step = -1;
  TensorMeta input, output;
  int64_t enqueued_ns = 0, started_ns = 0, completed_ns = 0;
  uint32_t thread_id = 0;
  std::string text;
  std::string purpose;  // the recording thread's ThreadScope ("" outside any, and in older dumps)
  std::vector<uint64_t> stack;

  bool is_p2p() const { return op == OpType::kSend || op == OpType::kRecv; }
  bool is_user_event() const { return op == OpType::kUserEvent; }
  // A span of the rank's own work (FlightRecorder::begin_span): [started_ns, completed_ns].
  bool is_span() const { return op == OpType::kUserSpan; }
  bool is_collective() const { return !is_p2p() && !is_user_event() && !is_span(); }
  bool finished() const { return state == EntryState::kCompleted || state == EntryState::kFailed; }
};

// One rank's dump.
struct RankDump {
  std::filesystem::path path;
  int version = 0;  // 0: read from another tool's format (PyTorch's)
  int rank = -1, world_size = -1;
  std::string hostname;
  int pid = 0;
  std::string run_id;  // the job's run id ("" in dumps before version 4 and in PyTorch's)
  DumpTrigger trigger = DumpTrigger::kApi;
  int initiator = -1;
  std::string reason;
  int64_t wall_time_us = 0;  // when the dump was written, wall clock
  int64_t monotonic_ns = 0;  // the same instant on the rank's monotonic clock
  uint64_t capacity = 0, recorded = 0;
  int64_t step = -1;
  bool stack_captured = false;
  std::vector<GroupInfo> groups;
  std::vector<GroupDrops> dropped;
  std::vector<TraceEntry> entries;  // oldest first

  // A monotonic timestamp of this rank on the wall clock, in ns (0 stays 0). The reader bounds
  // every timestamp so this cannot overflow.
  int64_t to_wall_ns(int64_t monotonic) const {
    return monotonic == 0 ? 0 : monotonic + (wall_time_us * 1000 - monotonic_ns);
  }
};

// Parses dump text; `name` (usually the path) prefixes every error message. Throws
// InvalidArgument for malformed JSON, a wrong or missing field, or an unsupported version.
RankDump parse_dump(std::string_view text, const std::string& name);
// Reads and parses one file. Throws IoError when it cannot be read, else as parse_dump.
RankDump read_dump(const std::filesystem::path& file);

// A file that could not be used, and why.
struct DumpProblem {
  std::filesystem::path path;
  std::string message;  // names the file and the problem
};

// How a rank's process ended, as its launcher saw it: tessel-run writes these to `exits.json`
// beside the dumps it gathers ({"format": "tessel-run-exits", "exits": [{"rank": 3,
// "exit_code": 0, "signal": 0, "wall_time_us": ...}]}). A rank that is still running has none.
struct ExitRecord {
  int rank = -1;
  int exit_code = -1;  // -1 when a signal ended it
  int signal = 0;      // the signal that ended it, 0 when it exited
  int64_t wall_time_us = 0;
};
inline constexpr std::string_view kExitsFileName = "exits.json";

// Every usable dump of a directory, sorted by rank, plus what was wrong with the rest.
struct DumpSet {
  std::vector<RankDump> dumps;
  std::vector<DumpProblem> problems;
  int world_size = -1;             // agreed by the dumps (-1 when none says)
  std::vector<int> missing_ranks;  // ranks of the world with no usable dump
  std::vector<ExitRecord> exits;   // from exits.json, when the directory has one
};

// exits.json as text; parse_exits reads it back (throws InvalidArgument naming `name`).
std::string exits_to_json(const std::vector<ExitRecord>& exits);
std::vector<ExitRecord> parse_exits(std::string_view text, const std::string& name);

// Loads every `tessel_fr_*.json` of `dir` (in parallel). Files that fail to parse, that carry a
// version this reader does not read, duplicate a rank, or disagree on the world size become
// problems; the set never throws for them. A directory without tessel dumps is read as
// PyTorch's flight-recorder dumps (files named <prefix><rank>, JSON or pickle: pytorch_dump.h);
// `world_size_hint` gives their world size when the highest ranks left no dump. Throws IoError
// when `dir` cannot be listed, InvalidArgument when it is not a directory, and InvalidArgument
// naming the run ids and which ranks' files carry each when its dumps belong to different jobs
// (dumps without a run id, older ones and PyTorch's, never count as another job).
DumpSet read_dump_dir(const std::filesystem::path& dir, int world_size_hint = -1);

}  // namespace tessel::fr
