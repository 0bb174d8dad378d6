#include "tessel/flight_recorder/internal/dump_digest.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "tessel/base/error.h"
#include "tessel/flight_recorder/internal/dump_stream.h"
#include "tessel/flight_recorder/pytorch_dump.h"

namespace tessel::fr::internal {
namespace {

bool same_tensor(const TensorMeta& a, const TensorMeta& b) {
  return std::strncmp(a.dtype, b.dtype, sizeof(a.dtype)) == 0 && a.ndim == b.ndim &&
         a.numel == b.numel && std::equal(a.shape, a.shape + a.ndim, b.shape);
}

size_t hash_call(const Call& c) {
  size_t h = std::hash<std::string>()(c.text);
  auto mix = [&h](uint64_t v) { h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
  if (!c.purpose.empty()) mix(std::hash<std::string>()(c.purpose));
  mix(static_cast<uint64_t>(c.op));
  mix(c.reduce_op ? 1 + static_cast<uint64_t>(*c.reduce_op) : 0);
  mix(static_cast<uint64_t>(static_cast<int64_t>(c.root)));
  for (const TensorMeta* t : {&c.input, &c.output}) {
    uint64_t dtype = 0;
    std::memcpy(&dtype, t->dtype, sizeof(dtype));
    mix(dtype);
    mix(t->ndim);
    for (int i = 0; i < t->ndim; ++i) mix(static_cast<uint64_t>(t->shape[i]));
    mix(static_cast<uint64_t>(t->numel));
  }
  return h;
}

// The id of `call` in `calls`, adding it when new.
uint32_t intern_call(const Call& call, std::vector<Call>& calls,
                     std::unordered_map<size_t, std::vector<uint32_t>>& ids) {
  auto& same_hash = ids[hash_call(call)];
  for (uint32_t id : same_hash) {
    if (calls[id] == call) return id;
  }
  const auto id = static_cast<uint32_t>(calls.size());
  calls.push_back(call);
  same_hash.push_back(id);
  return id;
}

// (step, count) pairs into runs of consecutive steps with equal counts; a step met twice (the
// step went back, or two groups of a family) counts the sum.
std::vector<StepRun> to_runs(std::vector<std::pair<int64_t, int64_t>> steps) {
  if (!std::is_sorted(steps.begin(), steps.end())) std::sort(steps.begin(), steps.end());
  std::vector<StepRun> runs;
  for (size_t i = 0; i < steps.size();) {
    const int64_t step = steps[i].first;
    int64_t count = 0;
    for (; i < steps.size() && steps[i].first == step; ++i) count += steps[i].second;
    if (!runs.empty() && runs.back().last + 1 == step && runs.back().count == count) {
      runs.back().last = step;
    } else {
      runs.push_back({step, step, count});
    }
  }
  return runs;
}

// Hands a dump's entries to a RankFold; the reader's sink for Digest::read.
class FoldSink : public EntrySink {
 public:
  FoldSink(Digest& digest, std::function<const GroupInfo*(GroupInfo&&)> share)
      : fold_(digest), share_(std::move(share)) {}
  void add(TraceEntry&& entry) override { fold_.fold(entry); }
  void finish(RankDump& dump) override {
    std::vector<const GroupInfo*> registered;
    for (auto& g : dump.groups) registered.push_back(share_(std::move(g)));
    std::vector<GroupInfo>().swap(dump.groups);
    result = fold_.finish(dump, std::move(registered));
  }
  RankDigest result;

 private:
  RankFold fold_;
  std::function<const GroupInfo*(GroupInfo&&)> share_;
};

// Finds collectives (coalesced index 0) at wanted (group, seq) keys in a dump read again.
class FindSink : public EntrySink {
 public:
  explicit FindSink(const std::vector<std::pair<uint64_t, uint64_t>>& wanted)
      : wanted_(wanted.begin(), wanted.end()) {}
  void add(TraceEntry&& e) override { look(e); }
  void finish(RankDump&) override {}
  void look(const TraceEntry& e) {
    if (!e.is_collective() || e.coalesced_index != 0) return;
    if (!wanted_.count({e.group_id, e.seq}) || found.count({e.group_id, e.seq})) return;
    found[{e.group_id, e.seq}] = {e.record_id, e.finished()};
  }
  std::map<std::pair<uint64_t, uint64_t>, Digest::Found> found;

 private:
  std::set<std::pair<uint64_t, uint64_t>> wanted_;
};

}  // namespace

bool Call::operator==(const Call& o) const {
  return op == o.op && reduce_op == o.reduce_op && root == o.root && text == o.text &&
         purpose == o.purpose && same_tensor(input, o.input) && same_tensor(output, o.output);
}

int64_t count_at(const std::vector<StepRun>& runs, int64_t step) {
  auto it = std::upper_bound(runs.begin(), runs.end(), step,
                             [](int64_t s, const StepRun& r) { return s < r.first; });
  if (it == runs.begin()) return 0;
  --it;
  return step <= it->last ? it->count : 0;
}

std::vector<StepRun> add_runs(const std::vector<StepRun>& a, const std::vector<StepRun>& b) {
  std::vector<std::pair<int64_t, int64_t>> steps;
  for (const auto* runs : {&a, &b}) {
    for (const auto& r : *runs) {
      for (int64_t s = r.first; s <= r.last; ++s) steps.emplace_back(s, r.count);
    }
  }
  return to_runs(std::move(steps));
}

const GroupHistory* RankDigest::history(uint64_t group) const {
  for (const auto& h : groups) {
    if (h.group == group) return &h;
  }
  return nullptr;
}

// RankFold ------------------------------------------------------------------------------------

RankFold::Group& RankFold::group(uint64_t id) {
  const auto [it, fresh] = group_index_.try_emplace(id, groups_.size());
  if (fresh) {
    groups_.emplace_back();
    groups_.back().history.group = id;
    groups_.back().window.reserve(kHeldPerGroup);
  }
  return groups_[it->second];
}

uint32_t RankFold::local_call(const TraceEntry& e) {
  const Call c{.op = e.op,
               .reduce_op = e.reduce_op,
               .root = e.root,
               .input = e.input,
               .output = e.output,
               .text = e.text,
               .purpose = e.purpose};
  return intern_call(c, calls_, call_ids_);
}

void RankFold::fold(const TraceEntry& e) {
  const uint32_t index = index_++;
  if (index == 0) oldest_enqueued_ns_ = e.enqueued_ns;
  if (e.is_user_event()) {
    last_event_ = e.text;
    return;
  }
  // Spans of the rank's own work take a ring slot but are no operation of a group: no evidence,
  // only, for those still open, what the rank computes (a few, the newest).
  if (e.is_span()) {
    constexpr size_t kMaxOpenSpans = 4;
    if (!e.finished() && e.purpose.empty()) {
      if (open_spans_.size() == kMaxOpenSpans) open_spans_.erase(open_spans_.begin());
      open_spans_.push_back({e.text, e.started_ns != 0 ? e.started_ns : e.enqueued_ns});
    }
    return;
  }
  // How long the rank spent in its previous operation (straggler evidence).
  const int64_t waited = previous_wait_ns_;
  if (e.completed_ns != 0) previous_wait_ns_ = e.completed_ns - e.enqueued_ns;
  if (e.state == EntryState::kFailed) {
    failed_.push_back({e.group_id, e.is_p2p() ? e.p2p_seq : e.seq, e.op});
  }
  const HeldEntry h{.record_id = e.record_id,
                    .group_id = e.group_id,
                    .seq = e.seq,
                    .p2p_seq = e.p2p_seq,
                    .step = e.step,
                    .enqueued_ns = e.enqueued_ns,
                    .completed_ns = e.completed_ns,
                    .index = index,
                    .call = local_call(e),
                    .coalesced_index = e.coalesced_index,
                    .peer = e.peer,
                    .op = e.op,
                    .state = e.state};

  Group& g = group(e.group_id);
  GroupHistory& hist = g.history;
  if (e.is_collective()) {
    const SeqKey key{e.seq, e.coalesced_index};
    if (hist.in_ring == 0) {
      hist.oldest = key;
    } else if (!(g.newest < key)) {
      hist.ordered = false;
    }
    g.newest = key;
    ++hist.in_ring;
    hist.collectives = true;
    hist.reached = std::max(hist.reached, e.seq);
    // A step counts the training loop's collectives only, not a scoped thread's (ThreadScope).
    if (e.step >= 0 && e.purpose.empty()) {
      if (g.steps.empty() || g.steps.back().first != e.step) {
        g.steps.emplace_back(e.step, 1);
      } else {
        ++g.steps.back().second;
      }
      g.first_stepped = std::min(g.first_stepped, index);
    }
    arrivals_.push_back({e.group_id, e.seq, e.coalesced_index, h.call, e.step, e.enqueued_ns,
                         e.completed_ns, waited, e.state});
  } else {
    const bool send = e.op == OpType::kSend;
    auto run = std::find_if(p2p_.rbegin(), p2p_.rend(), [&](const P2pRun& r) {
      return r.group == e.group_id && r.peer == e.peer && r.send == send;
    });
    if (run != p2p_.rend() && run->last + 1 == e.p2p_seq) {
      run->last = e.p2p_seq;
    } else {
      p2p_.push_back({e.group_id, e.peer, send, e.p2p_seq, e.p2p_seq});
    }
  }
  if (!h.finished() && !g.oldest_unfinished) g.oldest_unfinished = h;
  if (h.finished()) g.newest_finished = h;
  if (g.window.size() < kHeldPerGroup) {
    g.window.push_back(h);
  } else {
    g.window[g.next] = h;
    g.next = (g.next + 1) % kHeldPerGroup;
  }
}

size_t RankFold::held() const {
  size_t n = 0;
  for (const auto& g : groups_) {
    n += g.window.size() + (g.oldest_unfinished ? 1 : 0) + (g.newest_finished ? 1 : 0);
  }
  return n;
}

RankDigest RankFold::finish(const RankDump& dump, std::vector<const GroupInfo*> registered) {
  RankDigest r;
  r.registered = std::move(registered);
  r.last_event = std::move(last_event_);
  r.open_spans = std::move(open_spans_);
  r.entries = index_;
  r.oldest_enqueued_ns = oldest_enqueued_ns_;
  r.failed = std::move(failed_);
  r.p2p = std::move(p2p_);
  std::vector<std::pair<uint32_t, size_t>> order;  // (first stepped collective, group)
  r.held.reserve(held());
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    GroupHistory& hist = g.history;
    hist.oldest_held = {UINT64_MAX, UINT32_MAX};
    for (const auto& h : g.window) {
      r.held.push_back(h);
      if (!h.is_collective()) continue;
      ++hist.in_window;
      hist.oldest_held = std::min(hist.oldest_held, SeqKey{h.seq, h.coalesced_index});
    }
    for (const auto* pinned : {&g.oldest_unfinished, &g.newest_finished}) {
      if (*pinned) r.held.push_back(**pinned);
    }
    hist.steps = to_runs(std::move(g.steps));
    order.emplace_back(g.first_stepped, i);
  }
  std::sort(r.held.begin(), r.held.end(),
            [](const HeldEntry& a, const HeldEntry& b) { return a.index < b.index; });
  r.held.erase(
      std::unique(r.held.begin(), r.held.end(),
                  [](const HeldEntry& a, const HeldEntry& b) { return a.index == b.index; }),
      r.held.end());
  r.held.shrink_to_fit();
  std::stable_sort(order.begin(), order.end());
  for (const auto& [first, i] : order) r.groups.push_back(std::move(groups_[i].history));

  std::lock_guard lock(digest_.mutex_);
  std::vector<uint32_t> ids(calls_.size());
  for (size_t i = 0; i < calls_.size(); ++i) ids[i] = digest_.intern(calls_[i]);
  for (auto& h : r.held) h.call = ids[h.call];
  // Alignment records: this rank's arrival at each of its collectives.
  const int32_t rank = dump.rank;
  uint64_t cached_group = UINT64_MAX;
  GroupAlignment* ga = nullptr;
  int position = -1;
  for (const Arrival& a : arrivals_) {
    if (a.group != cached_group || ga == nullptr) {
      cached_group = a.group;
      const auto [it, fresh] = digest_.aligned_.try_emplace(a.group);
      ga = &it->second;
      if (fresh) {
        for (const GroupInfo* g : r.registered) {
          if (g->id == a.group) ga->ranks = g->ranks;
        }
        std::sort(ga->ranks.begin(), ga->ranks.end());
      }
      const auto p = std::lower_bound(ga->ranks.begin(), ga->ranks.end(), rank);
      position = p != ga->ranks.end() && *p == rank ? static_cast<int>(p - ga->ranks.begin()) : -1;
    }
    Alignment& al = ga->keys[{a.seq, a.coalesced_index}];
    ++al.count;
    if (a.state != EntryState::kCompleted) al.completed = false;
    const int64_t at = dump.to_wall_ns(a.enqueued_ns);
    if (at > al.last_at || (at == al.last_at && rank > al.last_rank)) {
      al.second_at = al.last_at;
      al.last_at = at;
      al.last_rank = rank;
      al.last_done = dump.to_wall_ns(a.completed_ns);
      al.last_waited = a.waited_ns;
    } else if (at > al.second_at) {
      al.second_at = at;
    }
    const uint32_t call = ids[a.call];
    auto cls = std::find_if(al.classes.begin(), al.classes.end(),
                            [&](const Alignment::Class& c) { return c.call == call; });
    if (cls == al.classes.end()) {
      al.classes.push_back({call, rank, a.step, {}, {}});
      cls = al.classes.end() - 1;
    } else if (rank < cls->first_rank) {
      cls->first_rank = rank;
      cls->first_step = a.step;
    }
    if (position >= 0) {
      if (cls->bits.empty()) cls->bits.resize((ga->ranks.size() + 63) / 64);
      cls->bits[static_cast<size_t>(position) / 64] |= uint64_t{1} << (position % 64);
    } else {
      cls->strays.push_back(rank);
    }
  }
  std::vector<Arrival>().swap(arrivals_);  // `= {}` would keep the capacity
  std::vector<Group>().swap(groups_);
  return r;
}

// Digest --------------------------------------------------------------------------------------

Digest::Digest(const DumpSet& set) : set_(&set) {
  ranks_.reserve(set.dumps.size());
  for (const auto& d : set.dumps) {
    RankFold fold(*this);
    for (const auto& e : d.entries) fold.fold(e);
    std::vector<const GroupInfo*> registered;
    for (const auto& g : d.groups) registered.push_back(&g);
    ranks_.push_back(fold.finish(d, std::move(registered)));
  }
}

Digest::~Digest() = default;

std::unique_ptr<Digest> Digest::read(const std::filesystem::path& dir, int world_size_hint) {
  std::unique_ptr<Digest> digest;
  auto pass = [&](const std::vector<std::filesystem::path>& only) {
    digest.reset(new Digest());
    Digest* d = digest.get();
    auto share = [d](GroupInfo&& g) { return d->share(std::move(g)); };
    return stream_dump_dir(
        dir, world_size_hint, [&] { return std::make_unique<FoldSink>(*d, share); }, only);
  };
  StreamedDumps read = pass({});
  if (read.finished_then_rejected && !read.files.empty()) {
    // A dump set aside after it was folded (a duplicate rank, another world size) has left its
    // collectives in the alignment records: fold the accepted files again without it. The
    // problems are the first pass's (the second does not see the files set aside).
    std::vector<DumpProblem> problems = std::move(read.set.problems);
    read = pass(read.files);
    for (auto& p : read.set.problems) {
      if (std::none_of(problems.begin(), problems.end(),
                       [&](const DumpProblem& q) { return q.path == p.path; })) {
        problems.push_back(std::move(p));
      }
    }
    read.set.problems = std::move(problems);
  }
  digest->owned_ = std::make_unique<DumpSet>(std::move(read.set));
  digest->set_ = digest->owned_.get();
  digest->files_ = std::move(read.files);
  for (auto& sink : read.sinks) {
    digest->ranks_.push_back(std::move(static_cast<FoldSink&>(*sink).result));
  }
  return digest;
}

uint32_t Digest::intern(const Call& call) { return intern_call(call, calls_, call_ids_); }

const GroupInfo* Digest::share(GroupInfo&& group) {
  std::lock_guard lock(mutex_);
  auto& same_id = group_ids_[group.id];
  for (const GroupInfo* g : same_id) {
    if (g->name == group.name && g->ranks == group.ranks) return g;
  }
  groups_.push_back(std::move(group));
  same_id.push_back(&groups_.back());
  return &groups_.back();
}

std::vector<MemberClass> Digest::classes(uint64_t group, const SeqKey& key) const {
  std::vector<MemberClass> out;
  const auto g = aligned_.find(group);
  if (g == aligned_.end()) return out;
  const auto a = g->second.keys.find(key);
  if (a == g->second.keys.end()) return out;
  for (const auto& c : a->second.classes) {
    MemberClass m{c.call, c.first_rank, c.first_step, {}};
    for (size_t w = 0; w < c.bits.size(); ++w) {
      for (uint64_t bits = c.bits[w]; bits != 0; bits &= bits - 1) {
        m.ranks.push_back(g->second.ranks[w * 64 + static_cast<size_t>(__builtin_ctzll(bits))]);
      }
    }
    m.ranks.insert(m.ranks.end(), c.strays.begin(), c.strays.end());
    std::sort(m.ranks.begin(), m.ranks.end());
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(),
            [](const MemberClass& x, const MemberClass& y) { return x.call < y.call; });
  return out;
}

size_t Digest::held_entries() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r.held.size();
  return n;
}

bool Digest::needs_fetch(size_t dump, uint64_t group, uint64_t seq) const {
  const GroupHistory* h = ranks_[dump].history(group);
  if (h == nullptr || h->in_ring == h->in_window) return false;
  if (!h->ordered) return true;
  const SeqKey key{seq, 0};
  return !(key < h->oldest) && key < h->oldest_held;
}

std::optional<Digest::Found> Digest::collective_at(size_t dump, uint64_t group,
                                                   uint64_t seq) const {
  for (const HeldEntry& e : ranks_[dump].held) {
    if (e.is_collective() && e.group_id == group && e.seq == seq && e.coalesced_index == 0) {
      return Found{e.record_id, e.finished()};
    }
  }
  if (!needs_fetch(dump, group, seq)) return std::nullopt;
  const Lookup key{dump, group, seq};
  if (!fetched_.count(key)) prefetch({key});
  return fetched_.at(key);
}

void Digest::prefetch(const std::vector<Lookup>& lookups) const {
  std::map<size_t, std::vector<std::pair<uint64_t, uint64_t>>> by_dump;
  for (const auto& key : lookups) {
    const auto& [dump, group, seq] = key;
    if (fetched_.count(key) || !needs_fetch(dump, group, seq)) continue;
    by_dump[dump].emplace_back(group, seq);
  }
  std::vector<std::pair<size_t, FindSink>> work;
  for (const auto& [dump, wanted] : by_dump) work.emplace_back(dump, FindSink(wanted));
  parallel_for(work.size(), [&](size_t i) {
    auto& [dump, sink] = work[i];
    const RankDump& d = set_->dumps[dump];
    if (owned_ == nullptr) {  // a set read whole: its entries are at hand
      for (const auto& e : d.entries) sink.look(e);
      return;
    }
    try {
      const std::string text = read_file_bytes(files_[dump]);
      if (d.version == 0) {
        for (const auto& e : parse_pytorch_dump(text, d.rank, files_[dump].string()).entries) {
          sink.look(e);
        }
      } else {
        parse_dump_into(text, files_[dump].string(), sink);
      }
    } catch (const Error&) {
      // Changed or gone since it was read: the entry counts as not found.
    }
  });
  for (const auto& [dump, sink] : work) {
    for (const auto& [group, seq] : by_dump.at(dump)) {
      const auto it = sink.found.find({group, seq});
      fetched_[{dump, group, seq}] =
          it == sink.found.end() ? std::nullopt : std::optional<Found>(it->second);
    }
  }
}

}  // namespace tessel::fr::internal
