#include "tessel/flight_recorder/reader.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/dump_stream.h"
#include "tessel/flight_recorder/internal/pytorch_timeouts.h"
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

}  // namespace

std::string internal::read_file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  TESSEL_CHECK(in.good(), IoError, "{}: cannot open: {}", file.string(), std::strerror(errno));
  std::string text(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  TESSEL_CHECK(!in.bad(), IoError, "{}: error while reading", file.string());
  return text;
}

void internal::parallel_for(size_t n, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t i = next++; i < n; i = next++) work(i);
  };
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::jthread> workers;  // joined at the end of this scope
  for (size_t i = 1; i < std::min(threads, n); ++i) workers.emplace_back(run);
  run();
}

RankDump read_dump(const std::filesystem::path& file) {
  return parse_dump(internal::read_file_bytes(file), file.string());
}

namespace {

// A directory of PyTorch flight-recorder dumps (pytorch_dump.h): files that are not one are
// ignored, files that claim to be one and do not parse are problems.
DumpSet read_pytorch_dumps(const std::vector<std::filesystem::path>& files, int world_size_hint) {
  DumpSet set;
  std::map<int, std::filesystem::path> by_rank;
  for (const auto& f : files) {
    try {
      const std::string bytes = internal::read_file_bytes(f);
      if (sniff_pytorch_dump(bytes) == ForeignFormat::kNone) continue;
      const int rank = rank_from_dump_name(f.filename().string());
      if (auto dup = by_rank.find(rank); dup != by_rank.end()) {
        set.problems.push_back({f, fmt::format("{}: rank {} is also dumped in {}", f.string(), rank,
                                               dup->second.string())});
        continue;
      }
      by_rank[rank] = f;
      set.dumps.push_back(parse_pytorch_dump(bytes, rank, f.string()));
    } catch (const Error& e) {
      set.problems.push_back({f, e.message()});
    }
  }
  settle_pytorch_groups(set.dumps, world_size_hint);
  internal::reconcile_pytorch_timeouts(set.dumps);  // timed-out entries read as finished
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

namespace {

// Dumps of different jobs (run ids) never make one verdict: throws InvalidArgument naming each
// run id with its ranks and files. Dumps without a run id (before version 4) are not counted.
void refuse_mixed_jobs(const std::filesystem::path& dir,
                       const std::vector<std::filesystem::path>& files,
                       const std::vector<std::optional<RankDump>>& parsed) {
  std::map<std::string, std::vector<size_t>> by_run;
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (parsed[i] && !parsed[i]->run_id.empty()) by_run[parsed[i]->run_id].push_back(i);
  }
  if (by_run.size() <= 1) return;
  std::vector<std::string> jobs;
  for (const auto& [run, members] : by_run) {
    std::vector<std::string> ranks, names;
    for (size_t i : members) {
      ranks.push_back(std::to_string(parsed[i]->rank));
      names.push_back(files[i].filename().string());
    }
    jobs.push_back(fmt::format("run id '{}' ({} {}: {})", run, ranks.size() == 1 ? "rank" : "ranks",
                               fmt::join(ranks, ","), fmt::join(names, ", ")));
  }
  throw InvalidArgument(fmt::format(
      "'{}' holds the dumps of {} different jobs, which never make one verdict: {}; analyze "
      "one job's dumps at a time (unless TESSEL_FR_DUMP_DIR is set, each job writes into "
      "/tmp/tessel_fr/<run id>/)",
      dir.string(), by_run.size(), fmt::join(jobs, "; ")));
}

}  // namespace

namespace internal {

StreamedDumps stream_dump_dir(const std::filesystem::path& dir, int world_size_hint,
                              const std::function<std::unique_ptr<EntrySink>()>& make_sink,
                              const std::vector<std::filesystem::path>& only) {
  std::error_code ec;
  TESSEL_CHECK(std::filesystem::is_directory(dir, ec), InvalidArgument,
               "'{}' is not a directory of flight-recorder dumps{}", dir.string(),
               ec ? ": " + ec.message() : "");
  std::vector<std::filesystem::path> files;
  std::filesystem::directory_iterator it(dir, ec);
  TESSEL_CHECK(!ec, IoError, "cannot list '{}': {}", dir.string(), ec.message());
  std::vector<std::filesystem::path> others;  // may be PyTorch's dumps
  const std::set<std::filesystem::path> wanted(only.begin(), only.end());
  for (const auto& entry : it) {
    if (!wanted.empty() && !wanted.count(entry.path())) continue;
    const std::string name = entry.path().filename().string();
    if (name.rfind("tessel_fr_", 0) == 0 && entry.path().extension() == ".json") {
      files.push_back(entry.path());
    } else if (entry.is_regular_file() && name != kExitsFileName &&
               rank_from_dump_name(name) >= 0) {
      others.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::sort(others.begin(), others.end());
  StreamedDumps out;
  if (files.empty() && !others.empty()) {
    // PyTorch's dumps settle their groups from every dump's entries: read whole, then handed on.
    out.set = read_pytorch_dumps(others, world_size_hint);
    for (auto& d : out.set.dumps) {
      auto sink = make_sink();
      for (auto& e : d.entries) sink->add(std::move(e));
      std::vector<TraceEntry>().swap(d.entries);
      sink->finish(d);
      out.sinks.push_back(std::move(sink));
      out.files.push_back(d.path);
    }
    return out;
  }

  std::vector<std::optional<RankDump>> parsed(files.size());
  std::vector<std::unique_ptr<EntrySink>> sinks(files.size());
  std::vector<std::string> errors(files.size());
  parallel_for(files.size(), [&](size_t i) {
    try {
      auto sink = make_sink();
      RankDump d = parse_dump_into(read_file_bytes(files[i]), files[i].string(), *sink);
      sink->finish(d);
      parsed[i] = std::move(d);
      sinks[i] = std::move(sink);
    } catch (const Error& e) {
      errors[i] = e.message();
    }
  });

  refuse_mixed_jobs(dir, files, parsed);
  DumpSet& set = out.set;
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
      out.finished_then_rejected = true;
      continue;
    }
    if (auto dup = by_rank.find(d.rank); dup != by_rank.end()) {
      set.problems.push_back(
          {files[i], fmt::format("{}: rank {} is also dumped in {}", files[i].string(), d.rank,
                                 set.dumps[dup->second].path.string())});
      out.finished_then_rejected = true;
      continue;
    }
    by_rank[d.rank] = set.dumps.size();
    set.dumps.push_back(std::move(d));
    out.sinks.push_back(std::move(sinks[i]));
    out.files.push_back(files[i]);
  }
  // Sort by rank, keeping sinks and files beside their dumps.
  std::vector<size_t> order(set.dumps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return set.dumps[a].rank < set.dumps[b].rank; });
  StreamedDumps sorted;
  for (size_t i : order) {
    sorted.set.dumps.push_back(std::move(set.dumps[i]));
    sorted.sinks.push_back(std::move(out.sinks[i]));
    sorted.files.push_back(std::move(out.files[i]));
  }
  sorted.set.problems = std::move(set.problems);
  sorted.set.world_size = set.world_size;
  sorted.finished_then_rejected = out.finished_then_rejected;
  for (int r = 0; r < sorted.set.world_size; ++r) {
    if (!by_rank.count(r)) sorted.set.missing_ranks.push_back(r);
  }
  const auto exits = dir / kExitsFileName;
  if (std::filesystem::exists(exits, ec)) {
    try {
      sorted.set.exits = parse_exits(read_file_bytes(exits), exits.string());
    } catch (const Error& e) {
      sorted.set.problems.push_back({exits, e.message()});
    }
  }
  return sorted;
}

}  // namespace internal

namespace {

// Keeps every entry: read_dump_dir's sink.
class KeepEntries : public internal::EntrySink {
 public:
  void add(TraceEntry&& entry) override { entries_.push_back(std::move(entry)); }
  void finish(RankDump& dump) override {
    if (dump.entries.empty()) dump.entries.swap(entries_);
  }

 private:
  std::vector<TraceEntry> entries_;
};

}  // namespace

DumpSet read_dump_dir(const std::filesystem::path& dir, int world_size_hint) {
  return internal::stream_dump_dir(dir, world_size_hint,
                                   [] { return std::make_unique<KeepEntries>(); })
      .set;
}

}  // namespace tessel::fr
