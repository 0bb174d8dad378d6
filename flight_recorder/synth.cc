#include "tessel/flight_recorder/synth.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <tuple>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/dump.h"
#include "tessel/flight_recorder/recorder.h"

namespace tessel::fr {
namespace {

constexpr uint64_t kWorld = 1, kHalf0 = 2, kHalf1 = 3, kPair = 4;
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSimStartNs = 1'000'000 * kMs;         // 1000 s of uptime
constexpr int64_t kWallStartUs = 1'760'000'000'000'000;  // a fixed date: reproducible dumps

std::atomic<int64_t> g_sim_now{kSimStartNs};
int64_t sim_clock() noexcept { return g_sim_now.load(std::memory_order_relaxed); }
int64_t sim_wall_clock() noexcept {
  return kWallStartUs + (g_sim_now.load(std::memory_order_relaxed) - kSimStartNs) / 1000;
}

struct Scenario {
  std::string_view name, description;
};
constexpr Scenario kScenarios[] = {
    {"healthy", "no fault: every rank runs every step"},
    {"skip_collective", "the culprit skips the last world all_reduce"},
    {"extra_collective", "the culprit issues one extra world all_reduce at the end"},
    {"size_mismatch", "the culprit's world all_reduce of the middle step has twice the elements"},
    {"dtype_mismatch", "the culprit's world all_reduce of the middle step is bf16, not f32"},
    {"reduce_op_mismatch", "the culprit's world all_reduce of the middle step reduces with max"},
    {"root_mismatch", "a world broadcast in the middle step: the culprit names itself as root"},
    {"deadlock", "culprit and partner issue a world and a pair all_reduce in opposite orders"},
    {"send_without_recv", "the partner sends to the culprit, which never posts the recv"},
    {"killed", "the culprit dies (no dump) before the middle step's collectives"},
    {"stopped", "the culprit stops before the middle step; its dump is two minutes stale"},
    {"straggler", "the culprit computes 50 ms longer than the others every step"},
    {"wrapped", "skip_collective with a 24-entry ring and many user events after the skip"},
};

struct SimOp {
  enum Kind { kCollective, kSend, kRecv, kEvent, kCompute, kDie, kStop };
  explicit SimOp(Kind k) : kind(k) {}
  Kind kind;
  uint64_t group = 0;
  OpType op = OpType::kAllReduce;
  ReduceOp reduce = ReduceOp::kSum;
  int root = -1;
  std::string dtype = "f32";
  int64_t numel = 1024;
  int peer = -1;  // global rank, send/recv
  int64_t duration_ns = 0;
  std::string text;
  int64_t step = -1;  // events: the training step they begin
};

struct SimRank {
  std::vector<SimOp> program;
  size_t pc = 0;
  int64_t now = kSimStartNs;
  bool blocked = false, dead = false, stopped = false;
  int64_t stopped_at = 0;
  std::map<uint64_t, uint64_t> seq;                             // group -> last seq issued
  std::map<std::tuple<uint64_t, int, bool>, uint64_t> p2p_seq;  // (group, peer, send) -> last
  std::unique_ptr<FlightRecorder> fr;
};

class Simulation {
 public:
  Simulation(const SynthOptions& o, size_t capacity) : o_(o), rng_(o.seed) {
    const int n = o.ranks;
    std::vector<int> all(n), lo, hi;
    for (int r = 0; r < n; ++r) all[r] = r;
    lo.assign(all.begin(), all.begin() + (n + 1) / 2);
    hi.assign(all.begin() + (n + 1) / 2, all.end());
    groups_[kWorld] = {"world", all};
    if (n >= 2) {
      groups_[kHalf0] = {"half0", lo};
      groups_[kHalf1] = {"half1", hi};
    }
    if (o.partner != o.culprit && o.partner >= 0 && o.partner < n) {
      groups_[kPair] = {"pair", {std::min(o.culprit, o.partner), std::max(o.culprit, o.partner)}};
    }
    ranks_.resize(n);
    for (int r = 0; r < n; ++r) {
      RecorderOptions ro;
      ro.capacity = capacity;
      ro.clock = sim_clock;
      ro.wall_clock = sim_wall_clock;
      ranks_[r].fr = std::make_unique<FlightRecorder>(ro);
      ranks_[r].fr->set_process_info(r, n);
      for (const auto& [id, g] : groups_) ranks_[r].fr->register_group(id, g.first, g.second);
    }
  }

  std::vector<SimOp>& program(int r) { return ranks_[r].program; }
  int half_of(int r) const { return r < (o_.ranks + 1) / 2 ? 0 : 1; }
  uint64_t half_group(int r) const { return o_.ranks >= 2 ? (half_of(r) ? kHalf1 : kHalf0) : 0; }
  int64_t jitter() { return std::uniform_int_distribution<int64_t>(0, kMs / 2)(rng_); }

  // Runs every program as far as the matching rules allow.
  void run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < o_.ranks; ++r) progress |= advance(r);
    }
  }

  // Writes the dumps: hung jobs at the end of a 2-minute wait, healthy ones at once.
  void dump(const std::filesystem::path& dir) {
    int64_t end = kSimStartNs;
    int initiator = -1;
    for (int r = 0; r < o_.ranks; ++r) {
      end = std::max(end, ranks_[r].now);
      if (initiator < 0 && ranks_[r].blocked && !ranks_[r].dead) initiator = r;
    }
    for (int r = 0; r < o_.ranks; ++r) {  // stopped ranks dumped when they stopped (stale)
      SimRank& s = ranks_[r];
      if (!s.stopped) continue;
      g_sim_now = s.stopped_at;
      write_dump(*s.fr, {DumpTrigger::kSignal, -1, "periodic dump before the rank stopped"}, dir);
    }
    g_sim_now = end + (initiator >= 0 ? 120'000 * kMs : kMs);
    for (int r = 0; r < o_.ranks; ++r) {
      SimRank& s = ranks_[r];
      if (s.dead || s.stopped) continue;
      DumpRequest req{DumpTrigger::kApi, -1, "synthetic scenario"};
      if (initiator >= 0) {
        req = r == initiator ? DumpRequest{DumpTrigger::kTimeout, r, "collective timed out"}
                             : DumpRequest{DumpTrigger::kStoreRequest, initiator, "rank timed out"};
      }
      write_dump(*s.fr, req, dir);
    }
  }

 private:
  struct Pending {
    int rank = -1;  // -1: this side of a channel is not posted yet
    uint64_t record_id = 0;
    std::tuple<OpType, std::optional<ReduceOp>, int, std::string, int64_t> signature;
  };

  // Runs rank r until it blocks or ends; true when it did anything.
  bool advance(int r) {
    SimRank& s = ranks_[r];
    bool did = false;
    while (!s.blocked && !s.dead && !s.stopped && s.pc < s.program.size()) {
      const SimOp& op = s.program[s.pc++];
      did = true;
      g_sim_now = s.now;
      switch (op.kind) {
        case SimOp::kEvent:
          if (op.step >= 0) s.fr->set_step(op.step);
          s.fr->record_event(op.text);
          break;
        case SimOp::kCompute:
          s.now += op.duration_ns;
          break;
        case SimOp::kDie:
          s.dead = true;
          break;
        case SimOp::kStop:
          s.stopped = true;
          s.stopped_at = s.now;
          break;
        case SimOp::kCollective:
          issue_collective(r, op);
          break;
        case SimOp::kSend:
        case SimOp::kRecv:
          issue_p2p(r, op);
          break;
      }
    }
    return did;
  }

  void issue_collective(int r, const SimOp& op) {
    SimRank& s = ranks_[r];
    const auto& members = groups_.at(op.group).second;
    RecordArgs a;
    a.group_id = op.group;
    a.seq = ++s.seq[op.group];
    a.op = op.op;
    a.reduce_op = op.op == OpType::kAllReduce ? std::optional<ReduceOp>(op.reduce) : std::nullopt;
    a.root = op.root;
    const int64_t out = op.op == OpType::kAllGather ? op.numel * members.size() : op.numel;
    a.input = TensorMeta::make(op.dtype, {op.numel});
    a.output = TensorMeta::make(op.dtype, {out});
    const uint64_t id = s.fr->record(a);
    s.fr->started(id);
    s.blocked = true;
    auto& pending = collectives_[{op.group, a.seq}];
    pending.push_back({r, id, {op.op, a.reduce_op, op.root, op.dtype, op.numel}});
    if (pending.size() < members.size()) return;
    // Every member issued it: complete it, unless the arguments disagree (a hang, as on a
    // real backend that waits for bytes that never come).
    for (const auto& p : pending) {
      if (p.signature != pending.front().signature) return;
    }
    int64_t done = 0;
    for (const auto& p : pending) done = std::max(done, ranks_[p.rank].now);
    done += kMs / 10;
    for (const auto& p : pending) finish(p.rank, p.record_id, done);
  }

  void issue_p2p(int r, const SimOp& op) {
    SimRank& s = ranks_[r];
    const bool send = op.kind == SimOp::kSend;
    const auto& members = groups_.at(op.group).second;
    RecordArgs a;
    a.group_id = op.group;
    a.op = send ? OpType::kSend : OpType::kRecv;
    a.peer =
        static_cast<int32_t>(std::find(members.begin(), members.end(), op.peer) - members.begin());
    a.p2p_seq = ++s.p2p_seq[{op.group, op.peer, send}];
    a.input = TensorMeta::make(op.dtype, {op.numel});
    a.output = a.input;
    const uint64_t id = s.fr->record(a);
    s.fr->started(id);
    s.blocked = true;
    const int src = send ? r : op.peer, dst = send ? op.peer : r;
    auto& channel = p2p_[{op.group, src, dst, a.p2p_seq}];
    (send ? channel.first : channel.second) = {r, id, {}};
    if (channel.first.rank < 0 || channel.second.rank < 0) return;
    const int64_t done = std::max(ranks_[src].now, ranks_[dst].now) + kMs / 10;
    finish(channel.first.rank, channel.first.record_id, done);
    finish(channel.second.rank, channel.second.record_id, done);
  }

  void finish(int rank, uint64_t record_id, int64_t when) {
    g_sim_now = when;
    ranks_[rank].fr->completed(record_id);
    ranks_[rank].now = when;
    ranks_[rank].blocked = false;
  }

  const SynthOptions o_;
  std::mt19937_64 rng_;
  std::map<uint64_t, std::pair<std::string, std::vector<int>>> groups_;
  std::vector<SimRank> ranks_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<Pending>> collectives_;
  std::map<std::tuple<uint64_t, int, int, uint64_t>, std::pair<Pending, Pending>> p2p_;
};

SimOp collective(uint64_t group, OpType op = OpType::kAllReduce) {
  SimOp s(SimOp::kCollective);
  s.group = group;
  s.op = op;
  return s;
}
SimOp p2p(SimOp::Kind kind, int peer) {
  SimOp s(kind);
  s.group = kWorld;
  s.peer = peer;
  s.numel = 256;
  return s;
}
SimOp event(std::string text, int64_t step = -1) {
  SimOp s(SimOp::kEvent);
  s.text = std::move(text);
  s.step = step;
  return s;
}
SimOp compute(int64_t ns) {
  SimOp s(SimOp::kCompute);
  s.duration_ns = ns;
  return s;
}

}  // namespace

const std::vector<std::string_view>& synth_scenarios() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const auto& s : kScenarios) v.push_back(s.name);
    return v;
  }();
  return names;
}

std::string_view synth_description(std::string_view scenario) {
  for (const auto& s : kScenarios) {
    if (s.name == scenario) return s.description;
  }
  return "";
}

void synth_write(std::string_view scenario, const SynthOptions& o,
                 const std::filesystem::path& dir) {
  TESSEL_CHECK(!synth_description(scenario).empty(), InvalidArgument,
               "unknown synthetic scenario '{}'; expected one of: {}", scenario,
               fmt::join(synth_scenarios(), ", "));
  TESSEL_CHECK(o.ranks >= 1 && o.steps >= 2, InvalidArgument,
               "synthetic job needs ranks >= 1 and steps >= 2, got ranks {} and steps {}", o.ranks,
               o.steps);
  TESSEL_CHECK(o.culprit >= 0 && o.culprit < o.ranks, InvalidArgument,
               "culprit rank {} is not a rank of a {}-rank job", o.culprit, o.ranks);
  const bool two_ranks = scenario == "deadlock" || scenario == "send_without_recv";
  TESSEL_CHECK(!two_ranks || (o.partner >= 0 && o.partner < o.ranks && o.partner != o.culprit),
               InvalidArgument,
               "scenario '{}' needs a partner rank other than the culprit {} in a {}-rank job, "
               "got {}",
               scenario, o.culprit, o.ranks, o.partner);
  TESSEL_CHECK(scenario != "root_mismatch" || o.culprit != 0, InvalidArgument,
               "root_mismatch: the culprit names itself as root, so it must not be rank 0");

  const bool wrapped = scenario == "wrapped";
  Simulation sim(o, wrapped ? 24 : o.capacity);
  const int middle = o.steps / 2;
  std::mt19937_64 rng(o.seed * 7919 + 1);
  for (int r = 0; r < o.ranks; ++r) {
    auto& p = sim.program(r);
    const bool culprit = r == o.culprit;
    for (int step = 0; step < o.steps; ++step) {
      const bool last = step == o.steps - 1;
      p.push_back(event(fmt::format("step {} begins", step), step));
      if (culprit && step == middle && scenario == "killed") p.push_back(SimOp(SimOp::kDie));
      if (culprit && step == middle && scenario == "stopped") p.push_back(SimOp(SimOp::kStop));
      int64_t work = 10 * kMs + std::uniform_int_distribution<int64_t>(0, kMs / 2)(rng);
      if (culprit && scenario == "straggler") work += 50 * kMs;
      p.push_back(compute(work));
      if (sim.half_group(r) != 0) p.push_back(collective(sim.half_group(r)));
      if (step == middle && scenario == "root_mismatch") {
        SimOp b = collective(kWorld, OpType::kBroadcast);
        b.root = culprit ? r : 0;
        p.push_back(b);
      }
      if (step == middle && scenario == "send_without_recv" && r == o.partner) {
        p.push_back(p2p(SimOp::kSend, o.culprit));
      }
      SimOp world = collective(kWorld);
      if (culprit && step == middle) {
        if (scenario == "size_mismatch") world.numel *= 2;
        if (scenario == "dtype_mismatch") world.dtype = "bf16";
        if (scenario == "reduce_op_mismatch") world.reduce = ReduceOp::kMax;
      }
      const bool deadlock_step = step == middle && scenario == "deadlock";
      if (deadlock_step && r == o.partner) p.push_back(collective(kPair));
      const bool skip = culprit && last && (scenario == "skip_collective" || wrapped);
      if (!skip) p.push_back(world);
      if (deadlock_step && r == o.culprit) p.push_back(collective(kPair));
    }
    if (culprit && scenario == "extra_collective") p.push_back(collective(kWorld));
    if (culprit && wrapped) {
      // Enough markers after the skip that the ring keeps no world entry of this rank.
      for (int i = 0; i < 40; ++i) p.push_back(event(fmt::format("evaluation batch {}", i)));
    }
  }
  sim.run();
  sim.dump(dir);
}

}  // namespace tessel::fr
