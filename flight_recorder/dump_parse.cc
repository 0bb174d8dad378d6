// parse_dump: one dump's text into a RankDump in a single pass (internal/json_cursor.h), so a
// thousand ranks' full rings read in seconds. Every failure names the file, the field's path and
// what was expected.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/dump_stream.h"
#include "tessel/flight_recorder/internal/json_cursor.h"
#include "tessel/flight_recorder/reader.h"

namespace tessel::fr {
namespace {

using internal::JsonCursor;

// Timestamps past this (year 2096 on the wall clock; 126 years of uptime) are corrupt.
constexpr int64_t kMaxNanoseconds = 4'000'000'000'000'000'000;

constexpr uint32_t key_hash(std::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

// Where a value is ("entries[3].input"), built only when an error needs it.
struct Path {
  const Path* parent = nullptr;
  std::string_view key;
  size_t index = SIZE_MAX;
  std::string str() const {
    std::string base = parent != nullptr ? parent->str() : "";
    std::string me = index != SIZE_MAX ? fmt::format("{}[{}]", key, index) : std::string(key);
    if (base.empty()) return me;
    return me.empty() ? base : base + "." + me;
  }
};

class Parser {
 public:
  // Entries go to `sink` when one is given, else into RankDump::entries.
  Parser(std::string_view text, const std::string& name, internal::EntrySink* sink)
      : c_(text), name_(name), size_(text.size()), sink_(sink) {}

  RankDump run() {
    RankDump d;
    d.path = name_;
    try {
      top(d);
      c_.finish();
    } catch (const JsonCursor::SyntaxError& e) {
      throw InvalidArgument(
          fmt::format("{}: not valid JSON (truncated or corrupt dump?) at byte {} of {}: {}", name_,
                      e.offset, size_, e.what));
    }
    return d;
  }

 private:
  [[noreturn]] void fail(const Path& at, std::string_view expected, std::string_view found) const {
    throw InvalidArgument(
        fmt::format("{}: {}: expected {}, found {}", name_, label(at), expected, found));
  }
  [[noreturn]] void bad_value(const Path& at, std::string_view expected,
                              std::string_view found) const {
    throw InvalidArgument(
        fmt::format("{}: {}: expected {}, found '{}'", name_, label(at), expected, found));
  }
  std::string label(const Path& at) const {
    const std::string s = at.str();
    return s.empty() ? "top level" : s;
  }
  // Reads one value with `read`, turning a wrong type into an error naming the path.
  template <typename Read>
  auto value(const Path& at, Read&& read) {
    try {
      return read();
    } catch (const JsonCursor::TypeError& e) {
      fail(at, e.expected, e.found);
    }
  }
  int64_t i64(const Path& at) {
    return value(at, [&] { return c_.integer(); });
  }
  uint64_t u64(const Path& at) {
    return value(at, [&] { return c_.unsigned_integer(); });
  }
  int32_t i32(const Path& at) {
    const int64_t v = i64(at);
    if (v < INT32_MIN || v > INT32_MAX) fail(at, "a 32-bit integer", "number");
    return static_cast<int32_t>(v);
  }
  uint32_t u32(const Path& at) {
    const uint64_t v = u64(at);
    if (v > UINT32_MAX) fail(at, "a 32-bit unsigned integer", "number");
    return static_cast<uint32_t>(v);
  }
  std::string str(const Path& at) {
    return value(at, [&] { return c_.string(); });
  }
  int64_t time(const Path& at, int64_t max) {
    const int64_t v = i64(at);
    if (v < 0 || v > max) {
      bad_value(at, fmt::format("a timestamp between 0 and {}", max), std::to_string(v));
    }
    return v;
  }
  template <typename OnKey>
  void object(const Path& at, OnKey&& on_key) {
    value(at, [&] {
      c_.object(on_key);
      return 0;
    });
  }
  template <typename OnItem>
  void array(const Path& at, OnItem&& on_item) {
    value(at, [&] {
      c_.array(on_item);
      return 0;
    });
  }
  // Fails naming the first of `keys` whose bit is not in `seen`.
  void require(const Path& at, uint64_t seen, std::initializer_list<const char*> keys) const {
    uint64_t bit = 1;
    for (const char* k : keys) {
      if ((seen & bit) == 0) {
        throw InvalidArgument(fmt::format("{}: {}: missing field '{}'", name_, label(at), k));
      }
      bit <<= 1;
    }
  }

  template <typename Enum, size_t N>
  Enum enumerated(const Path& at, std::string_view (*name)(Enum), const Enum (&values)[N],
                  std::string_view expected) {
    const std::string text = str(at);
    for (Enum v : values) {
      if (name(v) == text) return v;
    }
    bad_value(at, expected, text);
  }

  TensorMeta tensor(const Path& at) {
    TensorMeta t;
    uint64_t seen = 0;
    object(at, [&](std::string_view key) {
      const Path p{&at, key};
      switch (key_hash(key)) {
        case key_hash("dtype"): {
          const std::string dtype = str(p);
          if (dtype.size() >= sizeof(t.dtype)) bad_value(p, "a dtype name", dtype);
          std::memcpy(t.dtype, dtype.data(), dtype.size());
          seen |= 1;
          return;
        }
        case key_hash("shape"): {
          size_t n = 0;
          array(p, [&](size_t i) {
            const Path item{&at, "shape", i};
            if (i >= static_cast<size_t>(kMaxDims)) {
              bad_value(p, fmt::format("at most {} dimensions", kMaxDims), std::to_string(i + 1));
            }
            t.shape[i] = i64(item);
            n = i + 1;
          });
          t.ndim = static_cast<uint8_t>(n);
          seen |= 2;
          return;
        }
        case key_hash("numel"):
          t.numel = i64(p);
          seen |= 4;
          return;
        default:
          c_.skip();
      }
    });
    require(at, seen, {"dtype", "shape", "numel"});
    return t;
  }

  TraceEntry entry(const Path& at) {
    static constexpr OpType kOps[] = {
        OpType::kAllReduce, OpType::kBroadcast, OpType::kAllGather, OpType::kReduceScatter,
        OpType::kAllToAll,  OpType::kSend,      OpType::kRecv,      OpType::kBarrier,
        OpType::kUserEvent, OpType::kSplit,     OpType::kReduce,    OpType::kGather,
        OpType::kScatter,   OpType::kUserSpan};
    static constexpr EntryState kStates[] = {EntryState::kScheduled, EntryState::kStarted,
                                             EntryState::kCompleted, EntryState::kFailed};
    TraceEntry e;
    uint64_t seen = 0;
    object(at, [&](std::string_view key) {
      const Path p{&at, key};
      switch (key_hash(key)) {
        case key_hash("record_id"):
          e.record_id = u64(p);
          seen |= 1 << 0;
          return;
        case key_hash("group_id"):
          e.group_id = u64(p);
          seen |= 1 << 1;
          return;
        case key_hash("seq"):
          e.seq = u64(p);
          seen |= 1 << 2;
          return;
        case key_hash("peer"):
          e.peer = i32(p);
          seen |= 1 << 3;
          return;
        case key_hash("p2p_seq"):
          e.p2p_seq = u64(p);
          seen |= 1 << 4;
          return;
        case key_hash("op"):
          e.op = enumerated(p, op_name, kOps, "an op name such as 'all_reduce'");
          seen |= 1 << 5;
          return;
        case key_hash("reduce_op"): {
          const std::string text = str(p);
          if (text != "none") {
            bool ok = false;
            for (ReduceOp r : kAllReduceOps) {
              if (reduce_op_name(r) == text) {
                e.reduce_op = r;
                ok = true;
              }
            }
            if (!ok) bad_value(p, "a reduce op (none, sum, avg, max, min, product)", text);
          }
          seen |= 1 << 6;
          return;
        }
        case key_hash("root"):
          e.root = i32(p);
          seen |= 1 << 7;
          return;
        case key_hash("state"):
          e.state = enumerated(p, state_name, kStates, "scheduled/started/completed/failed");
          seen |= 1 << 8;
          return;
        case key_hash("coalesced_id"):
          e.coalesced_id = u32(p);
          seen |= 1 << 9;
          return;
        case key_hash("coalesced_index"):
          e.coalesced_index = u32(p);
          seen |= 1 << 10;
          return;
        case key_hash("callsite_id"):
          e.callsite_id = u32(p);
          seen |= 1 << 11;
          return;
        case key_hash("step"):
          e.step = i64(p);
          seen |= 1 << 12;
          return;
        case key_hash("input"):
          e.input = tensor(p);
          seen |= 1 << 13;
          return;
        case key_hash("output"):
          e.output = tensor(p);
          seen |= 1 << 14;
          return;
        case key_hash("enqueued_ns"):
          e.enqueued_ns = time(p, kMaxNanoseconds);
          seen |= 1 << 15;
          return;
        case key_hash("started_ns"):
          e.started_ns = time(p, kMaxNanoseconds);
          seen |= 1 << 16;
          return;
        case key_hash("completed_ns"):
          e.completed_ns = time(p, kMaxNanoseconds);
          seen |= 1 << 17;
          return;
        case key_hash("thread_id"):
          e.thread_id = u32(p);
          seen |= 1 << 18;
          return;
        case key_hash("text"):
          e.text = str(p);
          seen |= 1 << 19;
          return;
        case key_hash("purpose"):
          e.purpose = str(p);
          return;  // optional: newer dumps
        case key_hash("stack"):
          array(p, [&](size_t i) {
            const Path item{&at, "stack", i};
            const std::string frame = value(item, [&] { return c_.string(); });
            const bool hex = frame.size() > 2 && frame.size() <= 18 && frame.rfind("0x", 0) == 0 &&
                             std::all_of(frame.begin() + 2, frame.end(), ::isxdigit);
            if (!hex) fail(item, "a hex address string", "string");
            e.stack.push_back(std::stoull(frame.substr(2), nullptr, 16));
          });
          seen |= 1 << 20;
          return;
        default:
          c_.skip();
      }
    });
    require(at, seen,
            {"record_id", "group_id", "seq",    "peer",         "p2p_seq",         "op",
             "reduce_op", "root",     "state",  "coalesced_id", "coalesced_index", "callsite_id",
             "step",      "input",    "output", "enqueued_ns",  "started_ns",      "completed_ns",
             "thread_id", "text",     "stack"});
    return e;
  }

  void top(RankDump& d) {
    const Path root{};
    uint64_t seen = 0;
    std::string format;
    object(root, [&](std::string_view key) {
      const Path p{&root, key};
      switch (key_hash(key)) {
        case key_hash("format"):
          format = str(p);
          seen |= 1 << 0;
          return;
        case key_hash("version"):
          d.version = static_cast<int>(i64(p));
          seen |= 1 << 1;
          return;
        case key_hash("rank"):
          d.rank = i32(p);
          seen |= 1 << 2;
          return;
        case key_hash("world_size"):
          d.world_size = i32(p);
          seen |= 1 << 3;
          return;
        case key_hash("hostname"):
          d.hostname = str(p);
          seen |= 1 << 4;
          return;
        case key_hash("pid"):
          d.pid = i32(p);
          seen |= 1 << 5;
          return;
        case key_hash("run_id"):
          d.run_id = str(p);
          return;  // optional: version 4 on
        case key_hash("trigger"): {
          const std::string trigger = str(p);
          const auto t = parse_trigger(trigger);
          if (!t) bad_value(p, "a dump trigger such as 'timeout'", trigger);
          d.trigger = *t;
          seen |= 1 << 6;
          return;
        }
        case key_hash("initiator"):
          d.initiator = i32(p);
          seen |= 1 << 7;
          return;
        case key_hash("reason"):
          d.reason = str(p);
          seen |= 1 << 8;
          return;
        case key_hash("wall_time_us"):
          d.wall_time_us = time(p, kMaxNanoseconds / 1000);
          seen |= 1 << 9;
          return;
        case key_hash("monotonic_ns"):
          d.monotonic_ns = time(p, kMaxNanoseconds);
          seen |= 1 << 10;
          return;
        case key_hash("capacity"):
          d.capacity = u64(p);
          seen |= 1 << 11;
          return;
        case key_hash("recorded"):
          d.recorded = u64(p);
          seen |= 1 << 12;
          return;
        case key_hash("step"):
          d.step = i64(p);
          seen |= 1 << 13;
          return;
        case key_hash("stack_captured"):
          d.stack_captured = value(p, [&] { return c_.boolean(); });
          seen |= 1 << 14;
          return;
        case key_hash("groups"):
          array(p, [&](size_t i) {
            const Path g{&root, "groups", i};
            GroupInfo info;
            uint64_t gs = 0;
            object(g, [&](std::string_view k) {
              const Path q{&g, k};
              if (k == "id") {
                info.id = u64(q);
                gs |= 1;
              } else if (k == "name") {
                info.name = str(q);
                gs |= 2;
              } else if (k == "ranks") {
                array(q, [&](size_t r) {
                  const Path item{&g, "ranks", r};
                  info.ranks.push_back(static_cast<int>(value(item, [&] { return c_.integer(); })));
                });
                gs |= 4;
              } else {
                c_.skip();
              }
            });
            require(g, gs, {"id", "name", "ranks"});
            d.groups.push_back(std::move(info));
          });
          seen |= 1 << 15;
          return;
        case key_hash("dropped"):
          array(p, [&](size_t i) {
            const Path g{&root, "dropped", i};
            GroupDrops drop;
            uint64_t gs = 0;
            object(g, [&](std::string_view k) {
              const Path q{&g, k};
              if (k == "group_id") {
                drop.group_id = u64(q);
                gs |= 1;
              } else if (k == "last_dropped_seq") {
                drop.last_dropped_seq = u64(q);
                gs |= 2;
              } else if (k == "dropped") {
                drop.dropped = u64(q);
                gs |= 4;
              } else {
                c_.skip();
              }
            });
            require(g, gs, {"group_id", "last_dropped_seq", "dropped"});
            d.dropped.push_back(drop);
          });
          seen |= 1 << 16;
          return;
        case key_hash("entries"):
          // The header precedes the entries in every dump we write: check it before reading
          // thousands of entries of a file that is not ours.
          check_header(d, format, seen);
          if (sink_ != nullptr) {
            array(p, [&](size_t i) { sink_->add(entry(Path{&root, "entries", i})); });
          } else {
            if (d.capacity > 0) d.entries.reserve(std::min<uint64_t>(d.capacity, 1 << 20));
            array(p, [&](size_t i) { d.entries.push_back(entry(Path{&root, "entries", i})); });
          }
          seen |= 1 << 17;
          return;
        default:
          c_.skip();
      }
    });
    check_header(d, format, seen);
    require(root, seen,
            {"format", "version", "rank", "world_size", "hostname", "pid", "trigger", "initiator",
             "reason", "wall_time_us", "monotonic_ns", "capacity", "recorded", "step",
             "stack_captured", "groups", "dropped", "entries"});
    std::sort(d.groups.begin(), d.groups.end(),
              [](const GroupInfo& a, const GroupInfo& b) { return a.id < b.id; });
    for (size_t i = 0; i < d.groups.size(); ++i) {
      for (size_t k = 0; k < d.groups[i].ranks.size(); ++k) {
        const int r = d.groups[i].ranks[k];
        if (r < 0 || r >= d.world_size) {
          bad_value(Path{nullptr, fmt::format("groups[{}].ranks", i), k},
                    fmt::format("a rank below the world size {}", d.world_size), std::to_string(r));
        }
      }
    }
  }

  // Format, version, rank and world size, as soon as they are known.
  void check_header(const RankDump& d, const std::string& format, uint64_t seen) {
    if (seen & 1) {
      if (format != kDumpFormatName) {
        bad_value(Path{nullptr, "format"}, fmt::format("'{}'", kDumpFormatName), format);
      }
    }
    if (seen & 2) {
      TESSEL_CHECK(d.version >= kOldestDumpFormatVersion && d.version <= kDumpFormatVersion,
                   InvalidArgument,
                   "{}: dump format version {} is not supported; this reader understands "
                   "versions {} to {}",
                   name_, d.version, kOldestDumpFormatVersion, kDumpFormatVersion);
    }
    if ((seen & 12) == 12) {
      TESSEL_CHECK(d.world_size > 0 && d.rank >= 0 && d.rank < d.world_size, InvalidArgument,
                   "{}: rank {} is not a rank of a world of size {} (was set_process_info "
                   "called?)",
                   name_, d.rank, d.world_size);
    }
  }

  JsonCursor c_;
  const std::string& name_;
  const size_t size_;
  internal::EntrySink* const sink_;
};

}  // namespace

RankDump parse_dump(std::string_view text, const std::string& name) {
  return Parser(text, name, nullptr).run();
}

RankDump internal::parse_dump_into(std::string_view text, const std::string& name,
                                   EntrySink& sink) {
  return Parser(text, name, &sink).run();
}

}  // namespace tessel::fr
