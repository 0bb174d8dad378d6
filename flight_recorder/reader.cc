#include "tessel/flight_recorder/reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/pytorch_dump.h"

namespace tessel::fr {
namespace {

using Json = nlohmann::json;

// Timestamps past this (year 2096 on the wall clock; 126 years of uptime) are corrupt.
constexpr int64_t kMaxNanoseconds = 4'000'000'000'000'000'000;

// Typed access to a JSON object; every failure names the file and the field path.
class Fields {
 public:
  Fields(const Json& object, const std::string& file, std::string where)
      : j_(object), file_(file), where_(std::move(where)) {
    if (!j_.is_object()) fail("", "an object", j_);
  }

  const Json& at(const char* key) const {
    const auto it = j_.find(key);
    if (it == j_.end()) {
      throw InvalidArgument(fmt::format("{}: {}: missing field '{}'", file_, label(""), key));
    }
    return *it;
  }
  int64_t i64(const char* key) const {
    const Json& v = at(key);
    if (!v.is_number_integer()) fail(key, "an integer", v);
    return v.get<int64_t>();
  }
  uint64_t u64(const char* key) const {
    const Json& v = at(key);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
      fail(key, "an unsigned integer", v);
    }
    return v.get<uint64_t>();
  }
  int32_t i32(const char* key) const {
    const int64_t v = i64(key);
    if (v < INT32_MIN || v > INT32_MAX) fail(key, "a 32-bit integer", at(key));
    return static_cast<int32_t>(v);
  }
  uint32_t u32(const char* key) const {
    const uint64_t v = u64(key);
    if (v > UINT32_MAX) fail(key, "a 32-bit unsigned integer", at(key));
    return static_cast<uint32_t>(v);
  }
  std::string str(const char* key) const {
    const Json& v = at(key);
    if (!v.is_string()) fail(key, "a string", v);
    return v.get<std::string>();
  }
  bool boolean(const char* key) const {
    const Json& v = at(key);
    if (!v.is_boolean()) fail(key, "true or false", v);
    return v.get<bool>();
  }
  const Json& array(const char* key) const {
    const Json& v = at(key);
    if (!v.is_array()) fail(key, "an array", v);
    return v;
  }
  // A timestamp: non-negative and at most `max`, so every difference and clock conversion the
  // analyzer computes stays far inside int64.
  int64_t time(const char* key, int64_t max) const {
    const int64_t v = i64(key);
    if (v < 0 || v > max) {
      bad_value(key, fmt::format("a timestamp between 0 and {}", max), std::to_string(v));
    }
    return v;
  }
  std::string label(std::string_view key) const {
    if (key.empty()) return where_.empty() ? "top level" : where_;
    return where_.empty() ? std::string(key) : fmt::format("{}.{}", where_, key);
  }
  [[noreturn]] void fail(std::string_view key, std::string_view expected, const Json& v) const {
    throw InvalidArgument(
        fmt::format("{}: {}: expected {}, found {}", file_, label(key), expected, v.type_name()));
  }
  [[noreturn]] void bad_value(std::string_view key, std::string_view expected,
                              std::string_view found) const {
    throw InvalidArgument(
        fmt::format("{}: {}: expected {}, found '{}'", file_, label(key), expected, found));
  }

 private:
  const Json& j_;
  const std::string& file_;
  std::string where_;
};

template <typename Enum, size_t N>
Enum parse_enum(const Fields& f, const char* key, std::string_view (*name)(Enum),
                const Enum (&values)[N], std::string_view expected) {
  const std::string text = f.str(key);
  for (Enum v : values) {
    if (name(v) == text) return v;
  }
  f.bad_value(key, expected, text);
}

constexpr OpType kOps[] = {OpType::kAllReduce,     OpType::kBroadcast, OpType::kAllGather,
                           OpType::kReduceScatter, OpType::kAllToAll,  OpType::kSend,
                           OpType::kRecv,          OpType::kBarrier,   OpType::kUserEvent,
                           OpType::kSplit,         OpType::kReduce,    OpType::kGather,
                           OpType::kScatter};
constexpr EntryState kStates[] = {EntryState::kScheduled, EntryState::kStarted,
                                  EntryState::kCompleted, EntryState::kFailed};

TensorMeta parse_tensor(const Json& j, const std::string& file, const std::string& where) {
  const Fields f(j, file, where);
  TensorMeta t;
  const std::string dtype = f.str("dtype");
  if (dtype.size() >= sizeof(t.dtype)) f.bad_value("dtype", "a dtype name", dtype);
  std::memcpy(t.dtype, dtype.data(), dtype.size());
  const Json& shape = f.array("shape");
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    f.bad_value("shape", fmt::format("at most {} dimensions", kMaxDims),
                std::to_string(shape.size()));
  }
  t.ndim = static_cast<uint8_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!shape[i].is_number_integer()) f.fail(fmt::format("shape[{}]", i), "an integer", shape[i]);
    t.shape[i] = shape[i].get<int64_t>();
  }
  t.numel = f.i64("numel");
  return t;
}

TraceEntry parse_entry(const Json& j, const std::string& file, size_t index) {
  const std::string where = fmt::format("entries[{}]", index);
  const Fields f(j, file, where);
  TraceEntry e;
  e.record_id = f.u64("record_id");
  e.group_id = f.u64("group_id");
  e.seq = f.u64("seq");
  e.peer = f.i32("peer");
  e.p2p_seq = f.u64("p2p_seq");
  e.op = parse_enum(f, "op", op_name, kOps, "an op name such as 'all_reduce'");
  if (f.str("reduce_op") != "none") {
    e.reduce_op = parse_enum(f, "reduce_op", reduce_op_name, kAllReduceOps,
                             "a reduce op (none, sum, avg, max, min, product)");
  }
  e.root = f.i32("root");
  e.state = parse_enum(f, "state", state_name, kStates, "scheduled/started/completed/failed");
  e.coalesced_id = f.u32("coalesced_id");
  e.coalesced_index = f.u32("coalesced_index");
  e.callsite_id = f.u32("callsite_id");
  e.step = f.i64("step");
  e.input = parse_tensor(f.at("input"), file, where + ".input");
  e.output = parse_tensor(f.at("output"), file, where + ".output");
  e.enqueued_ns = f.time("enqueued_ns", kMaxNanoseconds);
  e.started_ns = f.time("started_ns", kMaxNanoseconds);
  e.completed_ns = f.time("completed_ns", kMaxNanoseconds);
  e.thread_id = f.u32("thread_id");
  e.text = f.str("text");
  const Json& stack = f.array("stack");
  for (size_t i = 0; i < stack.size(); ++i) {
    const std::string frame = stack[i].is_string() ? stack[i].get<std::string>() : "";
    uint64_t address = 0;
    const bool hex = frame.size() > 2 && frame.rfind("0x", 0) == 0 &&
                     std::all_of(frame.begin() + 2, frame.end(), ::isxdigit) && frame.size() <= 18;
    if (!hex) f.fail(fmt::format("stack[{}]", i), "a hex address string", stack[i]);
    address = std::stoull(frame.substr(2), nullptr, 16);
    e.stack.push_back(address);
  }
  return e;
}

}  // namespace

RankDump parse_dump(std::string_view text, const std::string& name) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw InvalidArgument(
        fmt::format("{}: not valid JSON (truncated or corrupt dump?) at byte {} of {}: {}", name,
                    e.byte, text.size(), e.what()));
  }
  const Fields f(j, name, "");
  RankDump d;
  d.path = name;
  const std::string format = f.str("format");
  if (format != kDumpFormatName)
    f.bad_value("format", fmt::format("'{}'", kDumpFormatName), format);
  d.version = static_cast<int>(f.i64("version"));
  TESSEL_CHECK(d.version >= kOldestDumpFormatVersion && d.version <= kDumpFormatVersion,
               InvalidArgument,
               "{}: dump format version {} is not supported; this reader understands versions {} "
               "to {}",
               name, d.version, kOldestDumpFormatVersion, kDumpFormatVersion);
  d.rank = f.i32("rank");
  d.world_size = f.i32("world_size");
  TESSEL_CHECK(d.world_size > 0 && d.rank >= 0 && d.rank < d.world_size, InvalidArgument,
               "{}: rank {} is not a rank of a world of size {} (was set_process_info called?)",
               name, d.rank, d.world_size);
  d.hostname = f.str("hostname");
  d.pid = f.i32("pid");
  const std::string trigger = f.str("trigger");
  const auto t = parse_trigger(trigger);
  if (!t) f.bad_value("trigger", "a dump trigger such as 'timeout'", trigger);
  d.trigger = *t;
  d.initiator = f.i32("initiator");
  d.reason = f.str("reason");
  d.wall_time_us = f.time("wall_time_us", kMaxNanoseconds / 1000);
  d.monotonic_ns = f.time("monotonic_ns", kMaxNanoseconds);
  d.capacity = f.u64("capacity");
  d.recorded = f.u64("recorded");
  d.step = f.i64("step");
  d.stack_captured = f.boolean("stack_captured");
  const Json& groups = f.array("groups");
  for (size_t i = 0; i < groups.size(); ++i) {
    const Fields g(groups[i], name, fmt::format("groups[{}]", i));
    GroupInfo info;
    info.id = g.u64("id");
    info.name = g.str("name");
    const Json& ranks = g.array("ranks");
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (!ranks[k].is_number_integer()) g.fail(fmt::format("ranks[{}]", k), "a rank", ranks[k]);
      const int64_t r = ranks[k].get<int64_t>();
      if (r < 0 || r >= d.world_size) {
        g.bad_value(fmt::format("ranks[{}]", k),
                    fmt::format("a rank below the world size {}", d.world_size), std::to_string(r));
      }
      info.ranks.push_back(static_cast<int>(r));
    }
    d.groups.push_back(std::move(info));
  }
  std::sort(d.groups.begin(), d.groups.end(),
            [](const GroupInfo& a, const GroupInfo& b) { return a.id < b.id; });
  const Json& dropped = f.array("dropped");
  for (size_t i = 0; i < dropped.size(); ++i) {
    const Fields g(dropped[i], name, fmt::format("dropped[{}]", i));
    d.dropped.push_back({g.u64("group_id"), g.u64("last_dropped_seq"), g.u64("dropped")});
  }
  const Json& entries = f.array("entries");
  d.entries.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) d.entries.push_back(parse_entry(entries[i], name, i));
  return d;
}

RankDump read_dump(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  TESSEL_CHECK(in.good(), IoError, "{}: cannot open dump: {}", file.string(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  TESSEL_CHECK(!in.bad(), IoError, "{}: error while reading the dump", file.string());
  return parse_dump(text.str(), file.string());
}

namespace {

std::string read_file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  TESSEL_CHECK(in.good(), IoError, "{}: cannot open: {}", file.string(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A directory of PyTorch flight-recorder dumps (pytorch_dump.h): files that are not one are
// ignored, files that claim to be one and do not parse are problems.
DumpSet read_pytorch_dumps(const std::vector<std::filesystem::path>& files, int world_size_hint) {
  DumpSet set;
  std::map<int, std::filesystem::path> by_rank;
  for (const auto& f : files) {
    try {
      const std::string bytes = read_file_bytes(f);
      if (sniff_pytorch_dump(bytes) == ForeignFormat::kNone) continue;
      const int rank = rank_from_dump_name(f.filename().string());
      if (auto dup = by_rank.find(rank); dup != by_rank.end()) {
        set.problems.push_back({f, fmt::format("{}: rank {} is also dumped in {}", f.string(),
                                               rank, dup->second.string())});
        continue;
      }
      by_rank[rank] = f;
      set.dumps.push_back(parse_pytorch_dump(bytes, rank, f.string()));
    } catch (const Error& e) {
      set.problems.push_back({f, e.message()});
    }
  }
  settle_pytorch_groups(set.dumps, world_size_hint);
  std::sort(set.dumps.begin(), set.dumps.end(),
            [](const RankDump& a, const RankDump& b) { return a.rank < b.rank; });
  set.world_size = set.dumps.empty() ? world_size_hint : set.dumps.front().world_size;
  for (int r = 0; r < set.world_size; ++r) {
    if (!by_rank.count(r)) set.missing_ranks.push_back(r);
  }
  return set;
}

}  // namespace

std::string exits_to_json(const std::vector<ExitRecord>& exits) {
  Json j = {{"format", "tessel-run-exits"}, {"exits", Json::array()}};
  for (const auto& e : exits) {
    j["exits"].push_back({{"rank", e.rank},
                          {"exit_code", e.exit_code},
                          {"signal", e.signal},
                          {"wall_time_us", e.wall_time_us}});
  }
  return j.dump(2) + "\n";
}

std::vector<ExitRecord> parse_exits(std::string_view text, const std::string& name) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", name, e.what()));
  }
  const Fields f(j, name, "");
  const std::string format = f.str("format");
  if (format != "tessel-run-exits") f.bad_value("format", "'tessel-run-exits'", format);
  std::vector<ExitRecord> out;
  const Json& exits = f.array("exits");
  for (size_t i = 0; i < exits.size(); ++i) {
    const Fields e(exits[i], name, fmt::format("exits[{}]", i));
    out.push_back({e.i32("rank"), e.i32("exit_code"), e.i32("signal"), e.i64("wall_time_us")});
  }
  return out;
}

DumpSet read_dump_dir(const std::filesystem::path& dir, int world_size_hint) {
  std::error_code ec;
  TESSEL_CHECK(std::filesystem::is_directory(dir, ec), InvalidArgument,
               "'{}' is not a directory of flight-recorder dumps{}", dir.string(),
               ec ? ": " + ec.message() : "");
  std::vector<std::filesystem::path> files;
  std::filesystem::directory_iterator it(dir, ec);
  TESSEL_CHECK(!ec, IoError, "cannot list '{}': {}", dir.string(), ec.message());
  std::vector<std::filesystem::path> others;  // may be PyTorch's dumps
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tessel_fr_", 0) == 0 && entry.path().extension() == ".json") {
      files.push_back(entry.path());
    } else if (entry.is_regular_file() && name != kExitsFileName && rank_from_dump_name(name) >= 0) {
      others.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::sort(others.begin(), others.end());
  if (files.empty() && !others.empty()) return read_pytorch_dumps(others, world_size_hint);

  // Parse in parallel: a thousand dumps are mostly JSON parsing.
  std::vector<std::optional<RankDump>> parsed(files.size());
  std::vector<std::string> errors(files.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < files.size(); i = next++) {
      try {
        parsed[i] = read_dump(files[i]);
      } catch (const Error& e) {
        errors[i] = e.message();
      }
    }
  };
  {
    const size_t n = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
    std::vector<std::jthread> workers;  // joined at the end of this scope
    for (size_t i = 1; i < std::min(n, files.size()); ++i) workers.emplace_back(work);
    work();
  }

  DumpSet set;
  std::map<int, size_t> by_rank;  // rank -> index in set.dumps
  for (size_t i = 0; i < files.size(); ++i) {
    if (!parsed[i]) {
      set.problems.push_back({files[i], errors[i]});
      continue;
    }
    RankDump& d = *parsed[i];
    if (set.world_size < 0) set.world_size = d.world_size;
    if (d.world_size != set.world_size) {
      set.problems.push_back(
          {files[i], fmt::format("{}: world size {} disagrees with {} in the other dumps",
                                 files[i].string(), d.world_size, set.world_size)});
      continue;
    }
    if (auto dup = by_rank.find(d.rank); dup != by_rank.end()) {
      set.problems.push_back(
          {files[i], fmt::format("{}: rank {} is also dumped in {}", files[i].string(), d.rank,
                                 set.dumps[dup->second].path.string())});
      continue;
    }
    by_rank[d.rank] = set.dumps.size();
    set.dumps.push_back(std::move(d));
  }
  std::sort(set.dumps.begin(), set.dumps.end(),
            [](const RankDump& a, const RankDump& b) { return a.rank < b.rank; });
  for (int r = 0; r < set.world_size; ++r) {
    if (!by_rank.count(r)) set.missing_ranks.push_back(r);
  }
  const auto exits = dir / kExitsFileName;
  if (std::filesystem::exists(exits, ec)) {
    try {
      std::ifstream in(exits, std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      set.exits = parse_exits(text.str(), exits.string());
    } catch (const Error& e) {
      set.problems.push_back({exits, e.message()});
    }
  }
  return set;
}

}  // namespace tessel::fr
