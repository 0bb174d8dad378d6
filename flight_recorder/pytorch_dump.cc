#include "tessel/flight_recorder/pytorch_dump.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/pickle.h"

namespace tessel::fr {
namespace {

using Json = nlohmann::json;

[[noreturn]] void bad(const std::string& name, const std::string& where, const std::string& what) {
  throw InvalidArgument(fmt::format("{}: {}: {}", name, where, what));
}

// PyTorch's scalar type names as tessel's dtype names.
std::string dtype_of(const std::string& torch_name) {
  static const std::map<std::string, std::string> names = {
      {"Float", "f32"}, {"BFloat16", "bf16"}, {"Half", "f16"}, {"Double", "f64"}, {"Long", "i64"},
      {"Int", "i32"},   {"Short", "i16"},     {"Char", "i8"},  {"Byte", "u8"},    {"Bool", "bool"}};
  const auto it = names.find(torch_name);
  return it != names.end() ? it->second : torch_name.substr(0, 7);
}

// "gloo:all_reduce" -> all_reduce; "nccl:send 0->1" / "nccl:recv 1<-0" -> send / recv (the
// ranks after the space are the group ranks of this rank and its peer).
OpType op_of(const std::string& profiling_name, const std::string& name, const std::string& where) {
  std::string op = profiling_name.substr(profiling_name.find(':') + 1);
  op = op.substr(0, op.find(' '));
  static const std::map<std::string, OpType> ops = {
      {"all_reduce", OpType::kAllReduce},
      {"allreduce", OpType::kAllReduce},
      {"all_reduce_coalesced", OpType::kAllReduce},
      {"broadcast", OpType::kBroadcast},
      {"all_gather", OpType::kAllGather},
      {"allgather", OpType::kAllGather},
      {"_allgather_base", OpType::kAllGather},
      {"all_gather_into_tensor_coalesced", OpType::kAllGather},
      {"reduce_scatter", OpType::kReduceScatter},
      {"_reduce_scatter_base", OpType::kReduceScatter},
      {"reduce_scatter_tensor_coalesced", OpType::kReduceScatter},
      {"all_to_all", OpType::kAllToAll},
      {"alltoall", OpType::kAllToAll},
      {"alltoall_base", OpType::kAllToAll},
      {"send", OpType::kSend},
      {"recv", OpType::kRecv},
      {"recv_anysource", OpType::kRecv},
      {"barrier", OpType::kBarrier},
      {"reduce", OpType::kReduce},
      {"gather", OpType::kGather},
      {"scatter", OpType::kScatter},
  };
  const auto it = ops.find(op);
  if (it == ops.end())
    bad(name, where,
        fmt::format("profiling_name '{}' is not an operation tessel-trace knows", profiling_name));
  return it->second;
}

int64_t integer(const Json& v, const std::string& name, const std::string& where) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_null()) return 0;
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (const std::exception&) {
    }
  }
  bad(name, where, fmt::format("expected an integer, found {}", v.dump()));
}

const Json& field(const Json& o, const char* key, const std::string& name,
                  const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end()) bad(name, where, fmt::format("missing field '{}'", key));
  return *it;
}

// The tensors of one side of an entry: dtype of the first, shape of the first, total elements.
TensorMeta tensors(const Json& entry, const char* sizes_key, const char* dtypes_key,
                   const std::string& name, const std::string& where) {
  TensorMeta t;
  const Json& sizes = field(entry, sizes_key, name, where);
  const Json& dtypes = field(entry, dtypes_key, name, where);
  if (!sizes.is_array() || !dtypes.is_array()) bad(name, where, "sizes and dtypes must be lists");
  if (sizes.empty()) return t;
  if (!dtypes.empty()) {
    const std::string d = dtype_of(dtypes[0].get<std::string>());
    std::copy_n(d.data(), std::min(d.size(), sizeof(t.dtype) - 1), t.dtype);
  }
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t numel = 1;
    if (!sizes[i].is_array()) bad(name, where, fmt::format("{}[{}] is not a shape", sizes_key, i));
    for (size_t k = 0; k < sizes[i].size(); ++k) {
      const int64_t dim = integer(sizes[i][k], name, where);
      numel *= dim;
      if (i == 0 && k < static_cast<size_t>(kMaxDims)) t.shape[k] = dim;
    }
    if (i == 0) t.ndim = static_cast<uint8_t>(std::min<size_t>(sizes[0].size(), kMaxDims));
    total += numel;
  }
  t.numel = total;
  return t;
}

// The peer's group rank of a send ("send 0->1": 1) or recv ("recv 1<-0": 0); -1 when the
// profiling name does not say (PyTorch's Gloo backend records no sends or receives).
int32_t peer_of(const std::string& profiling_name) {
  for (const char* arrow : {"->", "<-"}) {
    const size_t at = profiling_name.rfind(arrow);
    if (at == std::string::npos) continue;
    const std::string digits = profiling_name.substr(at + 2);
    if (digits.empty() || digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      return -1;
    }
    return std::stoi(digits);
  }
  return -1;
}

// A group's id from the name PyTorch gives it on every member (process_group[0]: "0" for the
// default group, then "1", "2", ... or a hash): pg_id counts the groups one process has built,
// so a 2x2 mesh's rank 0 and rank 1 both call their dp group pg 1 though they are different
// groups. Numeric names keep their number (+1); others hash into ids no number reaches.
uint64_t group_id_of(const std::string& uid) {
  if (!uid.empty() && uid.size() <= 9 && std::all_of(uid.begin(), uid.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    return std::stoull(uid) + 1;
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : uid) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h | (1ull << 62);
}

std::vector<int> parse_rank_list(const Json& v, const std::string& name, const std::string& where) {
  std::vector<int> ranks;
  if (v.is_array()) {
    for (const auto& r : v) ranks.push_back(static_cast<int>(integer(r, name, where)));
    return ranks;
  }
  if (!v.is_string()) bad(name, where, "ranks must be a list or its text");
  const std::string text = v.get<std::string>();  // "[0, 1, 2]"
  std::string number;
  for (char c : text + ",") {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      number += c;
    } else if (!number.empty()) {
      ranks.push_back(std::stoi(number));
      number.clear();
    }
  }
  return ranks;
}

}  // namespace

ForeignFormat sniff_pytorch_dump(std::string_view bytes) {
  if (bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x80 && bytes[1] >= 2 &&
      bytes[1] <= 5) {
    return ForeignFormat::kPytorchPickle;
  }
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || bytes[first] != '{') return ForeignFormat::kNone;
  const std::string_view head = bytes.substr(0, 1 << 16);
  const bool torch = head.find("\"pg_config\"") != std::string_view::npos ||
                     head.find("\"comm_lib_version\"") != std::string_view::npos ||
                     head.find("\"profiling_name\"") != std::string_view::npos;
  return torch ? ForeignFormat::kPytorchJson : ForeignFormat::kNone;
}

int rank_from_dump_name(const std::string& file_name) {
  std::string stem = file_name;
  if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".json") stem.resize(stem.size() - 5);
  if (stem.size() > 4 && stem.substr(stem.size() - 4) == ".pkl") stem.resize(stem.size() - 4);
  size_t i = stem.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(stem[i - 1]))) --i;
  if (i == stem.size() || stem.size() - i > 9) return -1;
  return std::stoi(stem.substr(i));
}

RankDump parse_pytorch_dump(std::string_view bytes, int rank, const std::string& name) {
  Json j;
  const ForeignFormat format = sniff_pytorch_dump(bytes);
  if (format == ForeignFormat::kPytorchPickle) {
    j = internal::unpickle(bytes, name);
  } else {
    try {
      j = Json::parse(bytes.begin(), bytes.end());
    } catch (const Json::parse_error& e) {
      bad(name, "top level", fmt::format("not valid JSON: {}", e.what()));
    }
  }
  if (!j.is_object()) bad(name, "top level", "expected a dict");
  RankDump d;
  d.path = name;
  d.version = 0;  // not a tessel dump: the analyzer counts every pending entry as hung
  d.rank = rank;
  d.hostname = "";
  d.trigger = DumpTrigger::kApi;
  d.reason = fmt::format("PyTorch flight recorder {} (version {})",
                         format == ForeignFormat::kPytorchPickle ? "pickle" : "JSON",
                         j.value("version", std::string("?")));
  std::map<uint64_t, GroupInfo> groups;
  std::map<std::tuple<uint64_t, OpType, int32_t>, uint64_t> p2p_count;  // per group, op, peer
  int64_t newest = 0;
  const Json& entries = field(j, "entries", name, "top level");
  if (!entries.is_array()) bad(name, "entries", "expected a list");
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string where = fmt::format("entries[{}]", i);
    const Json& e = entries[i];
    if (!e.is_object()) bad(name, where, "expected a dict");
    TraceEntry t;
    t.record_id =
        static_cast<uint64_t>(integer(field(e, "record_id", name, where), name, where)) + 1;
    const int64_t pg = integer(field(e, "pg_id", name, where), name, where);
    const Json& pgn = field(e, "process_group", name, where);
    const std::string uid = pgn.is_array() && !pgn.empty() && pgn[0].is_string()
                                ? pgn[0].get<std::string>()
                                : std::to_string(pg);
    const std::string desc = pgn.is_array() && pgn.size() > 1 ? pgn[1].get<std::string>() : "";
    t.group_id = group_id_of(uid);
    auto& g = groups[t.group_id];
    g.id = t.group_id;
    g.name = desc.empty() || desc == "undefined" ? fmt::format("pg{}", uid) : desc;
    const std::string profiling_name = field(e, "profiling_name", name, where).get<std::string>();
    t.op = op_of(profiling_name, name, where);
    t.seq = static_cast<uint64_t>(integer(field(e, "collective_seq_id", name, where), name, where));
    t.p2p_seq = static_cast<uint64_t>(integer(e.value("p2p_seq_id", Json(0)), name, where));
    if (t.is_p2p()) {
      // PyTorch's p2p_seq_id counts every send and recv of the group; matching a send with its
      // recv needs the count per peer and direction, as tessel's own dumps keep it.
      t.peer = peer_of(profiling_name);
      if (t.peer >= 0) t.p2p_seq = ++p2p_count[{t.group_id, t.op, t.peer}];
    }
    t.input = tensors(e, "input_sizes", "input_dtypes", name, where);
    t.output = tensors(e, "output_sizes", "output_dtypes", name, where);
    t.enqueued_ns = integer(field(e, "time_created_ns", name, where), name, where);
    t.started_ns = integer(e.value("time_discovered_started_ns", Json(0)), name, where);
    t.completed_ns = integer(e.value("time_discovered_completed_ns", Json(0)), name, where);
    const std::string state = e.value("state", std::string("scheduled"));
    const bool retired = e.value("retired", false);
    if (state == "completed" || retired) {
      t.state = EntryState::kCompleted;
      if (t.completed_ns == 0) t.completed_ns = std::max(t.started_ns, t.enqueued_ns);
    } else {
      t.state = state == "started" ? EntryState::kStarted : EntryState::kScheduled;
    }
    newest = std::max({newest, t.enqueued_ns, t.started_ns, t.completed_ns});
    d.entries.push_back(std::move(t));
  }
  // pg_config: members by group name, or (Gloo) one entry keyed "" on each rank.
  if (const auto it = j.find("pg_config"); it != j.end() && it->is_object()) {
    for (const auto& [key, cfg] : it->items()) {
      if (!cfg.is_object() || !cfg.contains("ranks")) continue;
      GroupInfo info;
      info.name = key;
      info.ranks = parse_rank_list(cfg["ranks"], name, "pg_config." + key);
      bool matched = false;
      for (auto& [id, g] : groups) {
        if (!key.empty() && (id == group_id_of(key) || key == g.name)) {
          g.ranks = info.ranks;
          matched = true;
        }
      }
      if (!matched) {
        info.id = 0;  // unattributed: settle_pytorch_groups places it
        d.groups.push_back(std::move(info));
      }
    }
  }
  for (auto& [id, g] : groups) d.groups.push_back(std::move(g));
  // Times are wall-clock nanoseconds; the dump's "now" is its newest stamp (the dump itself
  // carries none), so "how long pending" is measured from the last thing the rank recorded.
  d.monotonic_ns = newest;
  d.wall_time_us = newest / 1000;
  d.recorded = d.entries.size();
  d.capacity = d.entries.size();
  return d;
}

void settle_pytorch_groups(std::vector<RankDump>& dumps, int world_size_hint) {
  int world = world_size_hint;
  for (const auto& d : dumps) {
    world = std::max(world, d.rank + 1);
    for (const auto& g : d.groups) {
      for (int r : g.ranks) world = std::max(world, r + 1);
    }
  }
  // Members seen per group id: from pg_config where attributed, else the ranks that recorded
  // in it; unattributed pg_config lists go to the one non-default group they can belong to.
  std::map<uint64_t, std::set<int>> members;
  std::map<uint64_t, std::string> names;
  std::vector<std::vector<int>> loose;
  for (const auto& d : dumps) {
    for (const auto& g : d.groups) {
      if (g.id == 0) {
        loose.push_back(g.ranks);
        continue;
      }
      names[g.id] = g.name;
      members[g.id].insert(g.ranks.begin(), g.ranks.end());
    }
    for (const auto& e : d.entries) members[e.group_id].insert(d.rank);
  }
  for (auto& [id, name] : names) {
    if (name == "default_pg" || id == 1) {
      for (int r = 0; r < world; ++r) members[id].insert(r);
    }
  }
  for (const auto& ranks : loose) {
    if (static_cast<int>(ranks.size()) == world) continue;  // the default group
    const std::set<int> list(ranks.begin(), ranks.end());
    uint64_t only = 0;
    int candidates = 0;
    for (const auto& [id, seen] : members) {
      if (id == 1 || names[id] == "default_pg") continue;
      if (std::includes(list.begin(), list.end(), seen.begin(), seen.end())) {
        only = id;
        ++candidates;
      }
    }
    if (candidates == 1) members[only].insert(list.begin(), list.end());
  }
  for (auto& d : dumps) {
    d.world_size = world;
    d.groups.clear();
    for (const auto& [id, ranks] : members) {
      d.groups.push_back({id, names.count(id) ? names[id] : fmt::format("pg{}", id - 1),
                          std::vector<int>(ranks.begin(), ranks.end())});
    }
  }
}

}  // namespace tessel::fr
