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
// Mesh scenarios: the dp group of tp coordinate j is kDpBase + j, the tp group of dp coordinate
// i is kTpBase + i.
constexpr uint64_t kDpBase = 1 << 20, kTpBase = 2 << 20;
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
    {"aborted_waiters",
     "the culprit stops taking part before the middle step's world all_reduce; the others' "
     "all_reduce times out and, unhandled, ends each of them in SIGABRT"},
    {"late_arrival",
     "the culprit computes past the others' timeout in the middle step; they give up and die of "
     "SIGABRT, then it issues the all_reduce, fails and dies of SIGABRT too"},
    {"leave_world",
     "the culprit leaves the loop one collective early: it skips the last world all_reduce and "
     "goes on to the world barrier that ends training"},
    {"ring_skip_send",
     "every step each rank sends to rank+1 and receives from rank-1, then all_reduces on world; "
     "the culprit leaves out its send in the middle step"},
    {"ring_skip_recv",
     "the ring of ring_skip_send; the culprit leaves out its recv in the middle step"},
    {"mesh_skip_tp",
     "a (dp, tp) mesh (tp = --tp); every step a tp then a dp all_reduce, a world barrier at the "
     "end; the culprit leaves out its tp all_reduce in the middle step"},
    {"mesh_leave_tp",
     "the mesh loop; the culprit skips its last tp all_reduce and goes on to the dp all_reduce "
     "and the final world barrier"},
    {"mesh_leave_dp",
     "the mesh loop; the culprit skips its last dp all_reduce and goes on to the final world "
     "barrier"},
    {"mesh_swap",
     "the mesh loop; in the middle step the culprit and the partner (another tp and dp group) "
     "issue the dp all_reduce before the tp one: a cycle of waits across the two dimensions"},
    {"mesh_swap_habit",
     "mesh_swap, but the partner issues dp before tp in every step (harmless alone); only the "
     "culprit changes its order, in the middle step"},
    {"mesh_ring_skip_send",
     "the mesh loop with a send/recv ring inside each tp group before the tp all_reduce; the "
     "culprit leaves out its send in the middle step"},
};

// Timed-out scenarios: a collective not complete this long after a member issued it fails there.
constexpr int64_t kSynthTimeoutNs = 60'000 * kMs;

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
  bool aborted = false;  // died of SIGABRT after an operation failed (timeouts enabled)
  int64_t aborted_at = 0;
  std::map<uint64_t, uint64_t> seq;                             // group -> last seq issued
  std::map<std::tuple<uint64_t, int, bool>, uint64_t> p2p_seq;  // (group, peer, send) -> last
  std::unique_ptr<FlightRecorder> fr;
};

class Simulation {
 public:
  Simulation(const SynthOptions& o, size_t capacity, int64_t timeout_ns = 0, bool mesh = false)
      : o_(o), timeout_ns_(timeout_ns), rng_(o.seed) {
    const int n = o.ranks;
    std::vector<int> all(n), lo, hi;
    for (int r = 0; r < n; ++r) all[r] = r;
    lo.assign(all.begin(), all.begin() + (n + 1) / 2);
    hi.assign(all.begin() + (n + 1) / 2, all.end());
    groups_[kWorld] = {"world", all};
    if (mesh) {
      // Ranks r = i * tp + j on a dp x tp grid, as DeviceMesh lays them out.
      const int tp = o.tp, dp = n / o.tp;
      for (int j = 0; j < tp; ++j) {
        std::vector<int> column;
        for (int i = 0; i < dp; ++i) column.push_back(i * tp + j);
        groups_[kDpBase + j] = {"dp", column};
      }
      for (int i = 0; i < dp; ++i) {
        groups_[kTpBase + i] = {"tp",
                                std::vector<int>(all.begin() + i * tp, all.begin() + (i + 1) * tp)};
      }
    } else {
      if (n >= 2) {
        groups_[kHalf0] = {"half0", lo};
        groups_[kHalf1] = {"half1", hi};
      }
      if (o.partner != o.culprit && o.partner >= 0 && o.partner < n) {
        groups_[kPair] = {"pair", {std::min(o.culprit, o.partner), std::max(o.culprit, o.partner)}};
      }
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
    if (timeout_ns_ > 0) {
      // Collectives some member never issued time out on the members waiting in them.
      for (const auto& [key, pending] : collectives_) {
        if (pending.size() == groups_.at(key.first).second.size()) continue;
        for (const auto& p : pending) {
          if (!ranks_[p.rank].aborted)
            give_up(p.rank, p.record_id, ranks_[p.rank].now + timeout_ns_);
        }
      }
    }
    for (int r = 0; r < o_.ranks; ++r) {  // the fatal-signal handler's dump, when they aborted
      SimRank& s = ranks_[r];
      if (!s.aborted) continue;
      g_sim_now = s.aborted_at;
      write_dump(*s.fr, {DumpTrigger::kFatalSignal, r, "signal 6"}, dir);
    }
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
    // With timeouts, the first rank to give up asks the others for their dumps at once.
    int64_t first_abort = INT64_MAX;
    for (const auto& s : ranks_) {
      if (s.aborted) first_abort = std::min(first_abort, s.aborted_at);
    }
    if (first_abort != INT64_MAX) g_sim_now = first_abort + 10 * kMs;
    for (int r = 0; r < o_.ranks; ++r) {
      SimRank& s = ranks_[r];
      if (s.dead || s.stopped || s.aborted) continue;
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
    if (timeout_ns_ > 0) {
      int64_t first = INT64_MAX;
      for (const auto& p : pending) first = std::min(first, ranks_[p.rank].now);
      if (done - first > timeout_ns_) {
        // The early members gave up before the last came; it then finds its peers gone.
        for (const auto& p : pending) {
          const int64_t at = ranks_[p.rank].now;
          give_up(p.rank, p.record_id, at + timeout_ns_ < done ? at + timeout_ns_ : done + kMs);
        }
        return;
      }
    }
    done += kMs / 10;
    for (const auto& p : pending) finish(p.rank, p.record_id, done);
  }

  // The operation fails at `when` and the rank, not handling the error, dies of SIGABRT.
  void give_up(int rank, uint64_t record_id, int64_t when) {
    g_sim_now = when;
    ranks_[rank].fr->failed(record_id);
    ranks_[rank].now = when;
    ranks_[rank].aborted = true;
    ranks_[rank].aborted_at = when + kMs;
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
  const int64_t timeout_ns_;
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
SimOp p2p(SimOp::Kind kind, int peer, uint64_t group = kWorld) {
  SimOp s(kind);
  s.group = group;
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

// The mesh scenarios: each step a user event, compute, (a send/recv ring inside the tp group,)
// an all_reduce on tp, then one on dp; a world barrier ends training.
void write_mesh(std::string_view scenario, const SynthOptions& o,
                const std::filesystem::path& dir) {
  const int tp = o.tp;
  TESSEL_CHECK(tp >= 1 && o.ranks % tp == 0, InvalidArgument,
               "scenario '{}' lays {} ranks out as dp x tp with tp = {}, which does not divide "
               "them",
               scenario, o.ranks, tp);
  const bool swap = scenario == "mesh_swap" || scenario == "mesh_swap_habit";
  const bool ring = scenario == "mesh_ring_skip_send";
  TESSEL_CHECK(!swap || (o.partner >= 0 && o.partner < o.ranks &&
                         o.partner / tp != o.culprit / tp && o.partner % tp != o.culprit % tp),
               InvalidArgument,
               "scenario '{}' needs a partner rank in another tp group and another dp group than "
               "the culprit {} (tp = {}), got {}",
               scenario, o.culprit, tp, o.partner);
  TESSEL_CHECK(!ring || tp >= 2, InvalidArgument,
               "scenario '{}' runs a ring inside tp groups, which needs tp >= 2, got {}", scenario,
               tp);
  Simulation sim(o, o.capacity, 0, /*mesh=*/true);
  const int middle = o.steps / 2;
  std::mt19937_64 rng(o.seed * 7919 + 1);
  for (int r = 0; r < o.ranks; ++r) {
    auto& p = sim.program(r);
    const int i = r / tp, j = r % tp;
    const bool culprit = r == o.culprit;
    for (int step = 0; step < o.steps; ++step) {
      const bool last = step == o.steps - 1;
      p.push_back(event(fmt::format("step {} begins", step), step));
      p.push_back(compute(10 * kMs + std::uniform_int_distribution<int64_t>(0, kMs / 2)(rng)));
      if (ring) {
        // Even positions send first, odd ones receive first, so the blocking calls pair up.
        const int next = i * tp + (j + 1) % tp, prev = i * tp + (j + tp - 1) % tp;
        std::vector<SimOp> pair;
        if (!(culprit && step == middle)) pair.push_back(p2p(SimOp::kSend, next, kTpBase + i));
        pair.insert(j % 2 ? pair.begin() : pair.end(), p2p(SimOp::kRecv, prev, kTpBase + i));
        p.insert(p.end(), pair.begin(), pair.end());
      }
      bool skip_tp = culprit && ((scenario == "mesh_skip_tp" && step == middle) ||
                                 (scenario == "mesh_leave_tp" && last));
      bool skip_dp = culprit && scenario == "mesh_leave_dp" && last;
      const bool dp_first =
          swap && ((culprit && step == middle) ||
                   (r == o.partner && (scenario == "mesh_swap_habit" || step == middle)));
      std::vector<SimOp> ops;
      if (!skip_tp) ops.push_back(collective(kTpBase + i));
      if (!skip_dp) ops.push_back(collective(kDpBase + j));
      if (dp_first) std::reverse(ops.begin(), ops.end());
      p.insert(p.end(), ops.begin(), ops.end());
    }
    p.push_back(collective(kWorld, OpType::kBarrier));
  }
  sim.run();
  sim.dump(dir);
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

  if (scenario.substr(0, 5) == "mesh_") {
    write_mesh(scenario, o, dir);
    return;
  }
  const bool wrapped = scenario == "wrapped";
  const bool timed = scenario == "aborted_waiters" || scenario == "late_arrival";
  const bool ring = scenario.substr(0, 5) == "ring_";
  Simulation sim(o, wrapped ? 24 : o.capacity, timed ? kSynthTimeoutNs : 0);
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
      if (culprit && step == middle && scenario == "late_arrival") work += 2 * kSynthTimeoutNs;
      p.push_back(compute(work));
      if (ring && o.ranks >= 2) {
        // Even ranks send first, odd ones receive first, so the blocking calls pair up.
        const int next = (r + 1) % o.ranks, prev = (r + o.ranks - 1) % o.ranks;
        const bool skip_send = culprit && step == middle && scenario == "ring_skip_send";
        const bool skip_recv = culprit && step == middle && scenario == "ring_skip_recv";
        std::vector<SimOp> pair;
        if (!skip_send) pair.push_back(p2p(SimOp::kSend, next));
        if (!skip_recv) pair.insert(r % 2 ? pair.begin() : pair.end(), p2p(SimOp::kRecv, prev));
        p.insert(p.end(), pair.begin(), pair.end());
      }
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
      const bool skip = culprit && last &&
                        (scenario == "skip_collective" || wrapped || scenario == "leave_world");
      if (culprit && step == middle && scenario == "aborted_waiters") {
        p.push_back(compute(3 * kSynthTimeoutNs / 2));  // it stopped taking part
        break;
      }
      if (!skip) p.push_back(world);
      if (deadlock_step && r == o.culprit) p.push_back(collective(kPair));
    }
    if (culprit && scenario == "extra_collective") p.push_back(collective(kWorld));
    if (scenario == "leave_world") p.push_back(collective(kWorld, OpType::kBarrier));
    if (culprit && wrapped) {
      // Enough markers after the skip that the ring keeps no world entry of this rank.
      for (int i = 0; i < 40; ++i) p.push_back(event(fmt::format("evaluation batch {}", i)));
    }
  }
  sim.run();
  sim.dump(dir);
}

}  // namespace tessel::fr
