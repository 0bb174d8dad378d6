#include "tessel/collectives/internal/gloo_all_to_all.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "tessel/base/error.h"
#include "tessel/base/logging.h"
#include "tessel/collectives/internal/strided_copy.h"

namespace tessel::internal {
namespace {

using Buffer = ::gloo::transport::UnboundBuffer;

// Slots of our all_to_all: a prefix and 56 bits of the call's id (call_id()).
constexpr uint64_t kAllToAllSlotPrefix = uint64_t{0x7c} << 56;
// Slots of the shared-memory set-up: a prefix, the phase (8 bits) and 48 bits of the sequence.
constexpr uint64_t kShmSetupSlotPrefix = uint64_t{0x7b} << 56;

// Time left, rounded up: Gloo's wait then gives up no earlier than the deadline.
std::chrono::milliseconds millis_left(const Deadline& deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining()));
}

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// The size rounded up to the rings' 64-byte grain.
constexpr size_t align_up(size_t bytes) {
  return (bytes + ShmRing::kAlign - 1) / ShmRing::kAlign * ShmRing::kAlign;
}

// What identifies one exchange: the group's sequence number and the phase within that
// collective (reduce_scatter's rounds and all_reduce's gather under one number; 0 to 255).
constexpr uint64_t call_id(uint64_t seq, uint32_t phase) { return seq << 8 | (phase & 255u); }
std::string call_str(uint64_t call) {
  return call % 256 == 0 ? fmt::format("#{}", call >> 8)
                         : fmt::format("#{} (phase {})", call >> 8, call % 256);
}

// The record each call puts before its bytes in a ring (one 64-byte grain).
struct CallHeader {
  uint64_t call = 0;  // call_id()
  uint64_t bytes = 0;
  int32_t from = -1;
};
static_assert(sizeof(CallHeader) <= ShmRing::kAlign);

// Set-up records (phase 1 to every peer, phases 2 and 3 to the peers that may share memory).
struct Hello {
  char host[64] = {};
  uint64_t pid_namespace = 0;
  int32_t pid = 0;
  int32_t enabled = 0;
};
struct SegmentName {
  char name[64] = {};
  uint64_t nonce[2] = {0, 0};
  int32_t ok = 0;
};
struct Mapped {
  int32_t ok = 0;
};

// Sends outgoing[peer] to every rank in `peers` and receives each one's record into
// incoming[peer]; throws a Timeout naming the peers whose record did not arrive by the deadline.
template <typename Record>
void exchange(::gloo::Context& context, std::vector<Record>& outgoing,
              const std::vector<int>& peers, std::vector<Record>& incoming, uint64_t slot,
              const Deadline& deadline, Nanoseconds timeout) {
  if (peers.empty()) return;
  auto send = context.createUnboundBuffer(outgoing.data(), outgoing.size() * sizeof(Record));
  auto recv = context.createUnboundBuffer(incoming.data(), incoming.size() * sizeof(Record));
  for (int p : peers) recv->recv(p, slot, static_cast<size_t>(p) * sizeof(Record), sizeof(Record));
  for (int p : peers) send->send(p, slot, static_cast<size_t>(p) * sizeof(Record), sizeof(Record));
  std::vector<bool> arrived(incoming.size(), false);
  try {
    for (size_t i = 0; i < peers.size(); ++i) {
      int from = -1;
      if (!recv->waitRecv(&from, millis_left(deadline))) {
        throw CommError("all_to_all: a receive was aborted");
      }
      if (from >= 0) arrived[static_cast<size_t>(from)] = true;
    }
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!send->waitSend(millis_left(deadline))) throw CommError("all_to_all: a send was aborted");
    }
  } catch (const ::gloo::IoException& e) {
    if (std::string_view(e.what()).find("Timed out") == std::string_view::npos) throw;
    std::vector<int> missing;
    for (int p : peers) {
      if (!arrived[static_cast<size_t>(p)]) missing.push_back(p);
    }
    throw Timeout(fmt::format("all_to_all did not complete within {}; ranks not arrived: [{}]",
                              format_duration(timeout), fmt::join(missing, ", ")));
  }
}

// The peers of `rank` that may share memory with it: same host id, both enabled.
std::vector<int> candidates_of(int rank, const std::vector<Hello>& hello) {
  std::vector<int> out;
  const Hello& h = hello[static_cast<size_t>(rank)];
  if (!h.enabled) return out;
  for (size_t q = 0; q < hello.size(); ++q) {
    if (static_cast<int>(q) == rank || !hello[q].enabled) continue;
    if (std::strncmp(hello[q].host, h.host, sizeof(h.host)) == 0)
      out.push_back(static_cast<int>(q));
  }
  return out;
}

uint32_t index_in(const std::vector<int>& list, int rank) {
  return static_cast<uint32_t>(std::find(list.begin(), list.end(), rank) - list.begin());
}

// One peer's bytes, split into pieces: piece k is bytes [k * kPieceBytes, ...) of its packed form.
struct Pieces {
  size_t bytes = 0;
  static constexpr size_t kPiece = GlooAllToAll::kPieceBytes;
  int64_t count() const { return static_cast<int64_t>((bytes + kPiece - 1) / kPiece); }
  size_t offset(int64_t k) const { return static_cast<size_t>(k) * kPiece; }
  size_t length(int64_t k) const { return std::min(kPiece, bytes - offset(k)); }
};

// Elements [first, first + count) of this rank's own chunk, from its input view straight into
// its output view (through `bounce`, one piece of scratch, when both are strided).
void copy_own(const Tensor& in, const Tensor& out, int64_t first, int64_t count, uint8_t* bounce) {
  const int64_t element = static_cast<int64_t>(in.element_size());
  if (in.is_contiguous() && out.is_contiguous()) {
    std::memcpy(static_cast<uint8_t*>(out.data_ptr()) + first * element,
                static_cast<const uint8_t*>(in.data_ptr()) + first * element,
                static_cast<size_t>(count * element));
  } else if (in.is_contiguous()) {
    unpack_elements(static_cast<const uint8_t*>(in.data_ptr()) + first * element, out, first,
                    count);
  } else if (out.is_contiguous()) {
    pack_elements(in, first, count, static_cast<uint8_t*>(out.data_ptr()) + first * element,
                  worth_streaming(out.nbytes()));
  } else {
    pack_elements(in, first, count, bounce);
    unpack_elements(bounce, out, first, count);
  }
}

// Throws the Timeout of a call whose receives did not all complete, naming the peers whose data
// had not all arrived.
[[noreturn]] void throw_timeout(std::span<const std::unique_ptr<Buffer>> recv_buffers,
                                std::span<const Pieces> from, std::span<int64_t> arrived,
                                Nanoseconds timeout) {
  // Gloo closed every pair on the timeout, so the pieces that did arrive can still be counted
  // without waiting: a wait returns at once, with a piece or with the error.
  std::vector<int> missing;
  for (size_t p = 0; p < recv_buffers.size(); ++p) {
    if (recv_buffers[p] == nullptr) continue;
    try {
      while (arrived[p] < from[p].count() &&
             recv_buffers[p]->waitRecv(std::chrono::milliseconds(1))) {
        ++arrived[p];
      }
    } catch (const ::gloo::Exception&) {
    }
    if (arrived[p] < from[p].count()) missing.push_back(static_cast<int>(p));
  }
  if (missing.empty()) {
    throw Timeout(
        fmt::format("all_to_all: every piece arrived but the sends did not complete "
                    "within {}",
                    format_duration(timeout)));
  }
  throw Timeout(fmt::format("all_to_all did not complete within {}; ranks not arrived: [{}]",
                            format_duration(timeout), fmt::join(missing, ", ")));
}

}  // namespace

GlooAllToAll::GlooAllToAll(std::shared_ptr<::gloo::Context> context, SharedMemoryOptions shm)
    : context_(std::move(context)), shm_options_(std::move(shm)) {}

GlooAllToAll::~GlooAllToAll() = default;

std::vector<int> GlooAllToAll::shared_memory_peers() const {
  std::vector<int> out;
  for (const Local& l : locals_) out.push_back(l.rank);
  return out;
}

bool GlooAllToAll::group_may_share_memory(uint64_t seq, Nanoseconds timeout) {
  if (!shm_settled_) connect_shared_memory(seq, Deadline::after(timeout), timeout);
  return group_has_candidates_;
}

void GlooAllToAll::connect_shared_memory(uint64_t seq, const Deadline& deadline,
                                         Nanoseconds timeout) {
  const int n = context_->size, me = context_->rank;
  shm_settled_ = true;  // once: a set-up that fails leaves the group failed anyway
  local_index_.assign(static_cast<size_t>(n), -1);
  if (n == 1) return;
  auto slot = [seq](uint64_t phase) {
    return kShmSetupSlotPrefix | (phase << 48) | (seq & ((uint64_t{1} << 48) - 1));
  };
  std::vector<int> everyone;
  for (int p = 0; p < n; ++p) {
    if (p != me) everyone.push_back(p);
  }

  // Phase 1, every peer: host, process and whether shared memory is enabled.
  Hello mine;
  const std::string host = shm_options_.host_id.empty() ? this_boot_id() : shm_options_.host_id;
  std::strncpy(mine.host, host.c_str(), sizeof(mine.host) - 1);
  mine.pid_namespace = this_pid_namespace();
  mine.pid = static_cast<int32_t>(::getpid());
  mine.enabled = shm_options_.enabled && !host.empty() ? 1 : 0;
  std::vector<Hello> hello(static_cast<size_t>(n), mine);
  std::vector<Hello> hello_out(static_cast<size_t>(n), mine);
  exchange(*context_, hello_out, everyone, hello, slot(1), deadline, timeout);
  for (int r = 0; r < n && !group_has_candidates_; ++r) {
    group_has_candidates_ = !candidates_of(r, hello).empty();
  }
  const std::vector<int> candidates = candidates_of(me, hello);
  if (candidates.empty()) return;

  // Phase 2, the candidates: this rank's segment (a ring per candidate), by name and nonce.
  std::string why;
  own_ = ShmSegment::create(static_cast<uint32_t>(candidates.size()), &why);
  SegmentName name;
  if (own_.valid()) {
    std::strncpy(name.name, own_.name().c_str(), sizeof(name.name) - 1);
    name.nonce[0] = own_.header().nonce[0];
    name.nonce[1] = own_.header().nonce[1];
    name.ok = 1;
  } else {
    log_warn(LogComponent::kCollectives,
             "all_to_all: no shared memory with this host's ranks ({}); they use TCP", why);
  }
  std::vector<SegmentName> names(static_cast<size_t>(n)), names_out(static_cast<size_t>(n), name);
  exchange(*context_, names_out, candidates, names, slot(2), deadline, timeout);

  // Phase 3, the candidates: map theirs, tell each whether it worked. A pair shares memory when
  // both ends mapped the other's segment.
  std::vector<ShmSegment> segments(static_cast<size_t>(n));
  std::vector<Mapped> mapped(static_cast<size_t>(n)), mapped_out(static_cast<size_t>(n));
  for (int p : candidates) {
    const SegmentName& theirs = names[static_cast<size_t>(p)];
    if (!theirs.ok || !own_.valid()) continue;
    const std::string peer_name(theirs.name, strnlen(theirs.name, sizeof(theirs.name)));
    const auto rings = static_cast<uint32_t>(candidates_of(p, hello).size());
    segments[static_cast<size_t>(p)] = ShmSegment::open(peer_name, rings, theirs.nonce, &why);
    if (segments[static_cast<size_t>(p)].valid()) {
      mapped_out[static_cast<size_t>(p)].ok = 1;
    } else {
      log_warn(LogComponent::kCollectives, "all_to_all: rank {} uses TCP with rank {}: {}", me, p,
               why);
    }
  }
  exchange(*context_, mapped_out, candidates, mapped, slot(3), deadline, timeout);
  own_.unlink();  // every peer that will map it has

  for (int p : candidates) {
    const auto i = static_cast<size_t>(p);
    if (!mapped_out[i].ok || !mapped[i].ok) continue;
    Local l;
    l.rank = p;
    l.segment = std::move(segments[i]);
    l.out = &l.segment.ring(index_in(candidates_of(p, hello), me));
    l.in = &own_.ring(index_in(candidates, p));
    l.process = PeerProcess(hello[i].pid, hello[i].pid_namespace == mine.pid_namespace);
    local_index_[i] = static_cast<int>(locals_.size());
    locals_.push_back(std::move(l));
  }
  if (locals_.empty()) own_ = ShmSegment();
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int usable = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  // Ranks on this host: this group's, or the job's when the launcher says (LOCAL_WORLD_SIZE, as
  // tessel-run and torchrun set it) and it is more: other groups' ranks compete for the CPUs too.
  int on_host = static_cast<int>(locals_.size()) + 1;
  if (const char* local_world = std::getenv("LOCAL_WORLD_SIZE")) {
    on_host = std::max(on_host, std::atoi(local_world));
  }
  crowded_ = usable > 0 && on_host > usable;
  log_debug(LogComponent::kCollectives, "all_to_all: rank {} shares memory with ranks [{}]", me,
            fmt::join(shared_memory_peers(), ", "));
}

void GlooAllToAll::run_local(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                             uint64_t call, uint8_t* bounce, const Deadline& deadline,
                             Nanoseconds timeout) {
  constexpr size_t kRing = ShmRing::kRingBytes, kAlign = ShmRing::kAlign;
  constexpr size_t kChunk = size_t{64} << 10;  // copied per step: a ring holds four
  // How far this rank's own chunk may run ahead of the flows when it would otherwise wait.
  constexpr size_t kAheadWhenIdle = size_t{512} << 10;
  constexpr int kSpins = 256;  // idle steps before sleeping on the doorbell
  constexpr Nanoseconds kNap = std::chrono::milliseconds(5);  // between checks for dead peers
  TESSEL_CHECK(!shm_broken_, CommError,
               "all_to_all: an earlier all_to_all on this group failed and left its "
               "shared-memory channels out of step; create the group again");
  const int me = context_->rank;
  const auto element = static_cast<size_t>(inputs[static_cast<size_t>(me)].element_size());

  // One direction with one local peer: `done` counts the call's bytes through the ring,
  // rounded up to the 64-byte grain (the padding travels with the last chunk). A send is
  // finished once the receiver has also taken its header (`checked`): it checks the header
  // first, so a mismatch is reported to the sender before its call can return.
  struct Flow {
    Local* peer;
    const Tensor* view;
    size_t bytes;
    size_t done = 0;
    bool header = false;
    uint64_t header_end = 0;  // a send's ring position after its header
    bool checked = false;
    // The other end's count as last read (a send: the ring's tail; a receive: its head), read
    // again only when it does not allow a whole step: the line the other end writes is not
    // pulled over at every look.
    uint64_t seen = 0;
    bool finished() const { return header && checked && done == align_up(bytes); }
  };
  std::vector<Flow> outs, ins;
  for (Local& l : locals_) {
    const auto r = static_cast<size_t>(l.rank);
    outs.push_back({&l, &inputs[r], static_cast<size_t>(inputs[r].numel()) * element});
    outs.back().seen = l.out->tail.load(std::memory_order_acquire);
    ins.push_back({&l, &outputs[r], static_cast<size_t>(outputs[r].numel()) * element});
    ins.back().seen = l.in->head.load(std::memory_order_acquire);
  }
  const Tensor& own_in = inputs[static_cast<size_t>(me)];
  const Tensor& own_out = outputs[static_cast<size_t>(me)];
  const int64_t own_count = own_in.numel();
  int64_t own_done = 0;

  // Both are the group's failure, not this rank's arguments: CommError, which the process
  // group dumps for tessel-trace like a hang.
  auto mismatch = [&](int from, int to, uint64_t their_call, uint64_t sent, uint64_t expected) {
    if (their_call != call) {
      throw CommError(
          fmt::format("all_to_all {}: rank {} sent rank {} the data of its call "
                      "{}: the ranks' collectives on this group are out of step",
                      call_str(call), from, to, call_str(their_call)));
    }
    throw CommError(
        fmt::format("all_to_all {}: rank {} sends {} bytes to rank {}, which "
                    "expects {} from it: the ranks passed different sizes",
                    call_str(call), from, sent, to, expected));
  };

  // Split rows: when every send and this rank's own block are column blocks of one matrix (the
  // same rows and pitch; a Shard(0) -> Shard(1) exchange) larger than this core's cache, and
  // its own output is contiguous, bands of the matrix's rows are read once each, every block
  // going to its ring or to the output in the same pass, instead of once per block. Sends move
  // whole rows then. (Measured as raw/ours against the contiguous call, split rows against
  // separate passes: 1.04-1.08x better at 16 and 64 MiB on 2 ranks, 1.09-1.16x on 4, but
  // 0.91-0.95x at 4 MiB on 2, a matrix the cache holds, where the separate passes stay.)
  std::vector<RowRuns> layouts;
  std::vector<RowSink> sinks;
  int64_t rows_done = 0;  // rows of every send
  int64_t own_rows = 0;   // rows of this rank's own block (rows_done or, while waiting, more)
  bool fused = !outs.empty() && own_out.is_contiguous();
  for (size_t j = 0; fused && j <= outs.size(); ++j) {
    const Tensor& view = j < outs.size() ? *outs[j].view : own_in;
    const std::optional<RowRuns> l = row_runs(view);
    fused = l.has_value() && l->rows > 1 &&
            (layouts.empty() || (l->rows == layouts[0].rows && l->pitch == layouts[0].pitch));
    if (fused) layouts.push_back(*l);
  }
  if (fused) {
    fused = static_cast<size_t>(layouts[0].rows * layouts[0].pitch) > core_cache_bytes();
  }
  if (!fused) layouts.clear();
  sinks.resize(layouts.size());
  const size_t own_run_elements = fused ? layouts.back().run / element : 0;
  size_t widest = 0;
  for (const RowRuns& l : layouts) widest = std::max(widest, l.run);

  auto push = [&](Flow& f) {
    if (f.finished()) return false;
    ShmRing& r = *f.peer->out;
    if (r.fault.load(std::memory_order_acquire) != 0) {
      mismatch(me, f.peer->rank, r.fault_call, r.fault_sent, r.fault_expected);
    }
    uint64_t head = r.head.load(std::memory_order_relaxed);
    const size_t step = (f.header ? 0 : kAlign) + std::min(kChunk, align_up(f.bytes) - f.done);
    if (!f.checked || kRing - static_cast<size_t>(head - f.seen) < step) {
      f.seen = r.tail.load(std::memory_order_acquire);
    }
    const uint64_t tail = f.seen;
    size_t space = kRing - static_cast<size_t>(head - tail);
    bool moved = false;
    if (!f.header) {
      if (space < kAlign) return false;
      const CallHeader h{call, f.bytes, me};
      std::memcpy(r.data + head % kRing, &h, sizeof(h));
      head += kAlign;
      space -= kAlign;
      f.header = moved = true;
      f.header_end = head;
    }
    if (!f.checked && tail >= f.header_end) f.checked = moved = true;
    const size_t at = head % kRing;
    // Split rows move a send's data (below); here only its header and its padding.
    const size_t n = fused && f.done < f.bytes
                         ? 0
                         : std::min({space, align_up(f.bytes) - f.done, kRing - at, kChunk});
    if (n > 0) {
      const size_t data = f.done < f.bytes ? std::min(n, f.bytes - f.done) : 0;
      if (data > 0 && f.view->is_contiguous()) {
        std::memcpy(r.data + at, static_cast<const uint8_t*>(f.view->data_ptr()) + f.done, data);
      } else if (data > 0) {
        pack_elements(*f.view, static_cast<int64_t>(f.done / element),
                      static_cast<int64_t>(data / element), r.data + at);
      }
      head += n;
      f.done += n;
      moved = true;
    }
    if (moved) {
      r.head.store(head, std::memory_order_release);
      ring_bell(f.peer->segment.header());
    }
    return moved;
  };

  auto pull = [&](Flow& f) {
    if (f.finished()) return false;
    ShmRing& r = *f.peer->in;
    uint64_t tail = r.tail.load(std::memory_order_relaxed);
    const size_t step = (f.header ? 0 : kAlign) + std::min(kChunk, align_up(f.bytes) - f.done);
    if (static_cast<size_t>(f.seen - tail) < step) f.seen = r.head.load(std::memory_order_acquire);
    size_t avail = static_cast<size_t>(f.seen - tail);
    bool moved = false;
    if (!f.header) {
      if (avail < kAlign) return false;
      CallHeader h;
      std::memcpy(&h, r.data + tail % kRing, sizeof(h));
      if (h.call != call || h.bytes != f.bytes) {
        r.fault_call = h.call;
        r.fault_sent = h.bytes;
        r.fault_expected = f.bytes;
        r.fault.store(1, std::memory_order_release);
        ring_bell(f.peer->segment.header());
        mismatch(f.peer->rank, me, h.call, h.bytes, f.bytes);
      }
      tail += kAlign;
      avail -= kAlign;
      f.header = f.checked = moved = true;
    }
    const size_t at = tail % kRing;
    const size_t n = std::min({avail, align_up(f.bytes) - f.done, kRing - at, kChunk});
    if (n > 0) {
      const size_t data = f.done < f.bytes ? std::min(n, f.bytes - f.done) : 0;
      if (data > 0 && f.view->is_contiguous()) {
        std::memcpy(static_cast<uint8_t*>(f.view->data_ptr()) + f.done, r.data + at, data);
      } else if (data > 0) {
        unpack_elements(r.data + at, *f.view, static_cast<int64_t>(f.done / element),
                        static_cast<int64_t>(data / element));
      }
      tail += n;
      f.done += n;
      moved = true;
    }
    if (moved) {
      r.tail.store(tail, std::memory_order_release);
      ring_bell(f.peer->segment.header());
    }
    return moved;
  };

  // One band of split rows, as many as every ring has room for (at most a chunk's worth of the
  // widest block), after every send's header.
  auto push_rows = [&] {
    if (!fused || rows_done == layouts[0].rows) return false;
    int64_t band = std::min<int64_t>(layouts[0].rows - rows_done,
                                     std::max<int64_t>(1, static_cast<int64_t>(kChunk / widest)));
    for (size_t j = 0; j < outs.size(); ++j) {
      Flow& f = outs[j];
      if (!f.header) return false;
      ShmRing& r = *f.peer->out;
      const uint64_t head = r.head.load(std::memory_order_relaxed);
      const size_t want = static_cast<size_t>(band) * layouts[j].run;
      if (kRing - static_cast<size_t>(head - f.seen) < want) {
        f.seen = r.tail.load(std::memory_order_acquire);
      }
      const size_t space = kRing - static_cast<size_t>(head - f.seen);
      band = std::min<int64_t>(band, static_cast<int64_t>(space / layouts[j].run));
      sinks[j] = {r.data, kRing, static_cast<size_t>(head % kRing), false};
    }
    if (band == 0) return false;
    // This rank's own block goes along unless it ran ahead while the rings were full; then the
    // band stops where the own block is, so they go together again from there.
    const bool with_own = own_rows == rows_done;
    if (!with_own) band = std::min(band, own_rows - rows_done);
    sinks.back() = {static_cast<uint8_t*>(own_out.data_ptr()), 0,
                    static_cast<size_t>(rows_done) * layouts.back().run,
                    worth_streaming(own_out.nbytes())};
    const size_t n = with_own ? layouts.size() : outs.size();
    split_rows(std::span(layouts).first(n), rows_done, band, std::span(sinks).first(n));
    for (size_t j = 0; j < outs.size(); ++j) {
      Flow& f = outs[j];
      ShmRing& r = *f.peer->out;
      const size_t moved = static_cast<size_t>(band) * layouts[j].run;
      r.head.store(r.head.load(std::memory_order_relaxed) + moved, std::memory_order_release);
      f.done += moved;
      ring_bell(f.peer->segment.header());
    }
    rows_done += band;
    if (with_own) own_rows = rows_done;
    own_done = own_rows * static_cast<int64_t>(own_run_elements);
    return true;
  };

  // While the rings are full: this rank's own block alone, a band ahead, as far as
  // kAheadWhenIdle (its rows are then read again for the sends, still in cache).
  auto own_rows_ahead = [&] {
    if (!fused || own_rows == layouts[0].rows) return false;
    const int64_t limit = std::min<int64_t>(
        layouts[0].rows,
        rows_done + std::max<int64_t>(1, static_cast<int64_t>(kAheadWhenIdle) / layouts[0].pitch));
    const int64_t band = std::min<int64_t>(
        limit - own_rows, std::max<int64_t>(1, static_cast<int64_t>(kChunk / widest)));
    if (band <= 0) return false;
    RowSink own{static_cast<uint8_t*>(own_out.data_ptr()), 0,
                static_cast<size_t>(own_rows) * layouts.back().run,
                worth_streaming(own_out.nbytes())};
    split_rows(std::span(layouts).last(1), own_rows, band, std::span(&own, 1));
    own_rows += band;
    own_done = own_rows * static_cast<int64_t>(own_run_elements);
    return true;
  };

  auto all_finished = [&] {
    auto done = [](const Flow& f) { return f.finished(); };
    return own_done == own_count && std::all_of(outs.begin(), outs.end(), done) &&
           std::all_of(ins.begin(), ins.end(), done);
  };

  // Ranks to name when the deadline passes: those whose data has not all arrived, else those
  // that have not taken all of ours.
  auto not_arrived = [&] {
    std::vector<int> missing;
    for (const Flow& f : ins) {
      if (!f.finished()) missing.push_back(f.peer->rank);
    }
    if (missing.empty()) {
      for (const Flow& f : outs) {
        if (!f.finished()) missing.push_back(f.peer->rank);
      }
    }
    return missing;
  };

  Doorbell bell(own_.header());
  bool armed = false;
  uint32_t rung = 0;
  int idle = 0;
  try {
    while (true) {
      bool moved = false;
      for (Flow& f : outs) moved |= push(f);
      moved |= push_rows();
      // This rank's own chunk keeps pace with the flows that share its strided view (the sends
      // when the input is strided, else the receives when the output is): its piece then
      // covers the rows whose other columns they just read or wrote, still in cache.
      size_t frontier = 0;
      bool flows_left = false;
      for (const Flow& f : !own_in.is_contiguous() ? outs : ins) {
        if (f.finished() || (own_in.is_contiguous() && own_out.is_contiguous())) continue;
        flows_left = true;
        frontier = std::max(frontier, f.done);
      }
      // Waiting for the flows, it may run further ahead, as far as the rows still fit in cache.
      const auto own_limit =
          flows_left ? static_cast<int64_t>((frontier + kChunk) / element) : own_count;
      const auto idle_limit =
          flows_left ? static_cast<int64_t>((frontier + kAheadWhenIdle) / element) : own_count;
      auto copy_own_piece = [&](int64_t limit) {
        const int64_t count = std::min<int64_t>(std::min(own_count, limit) - own_done,
                                                static_cast<int64_t>(kChunk / element));
        copy_own(own_in, own_out, own_done, count, bounce);
        own_done += count;
      };
      if (!fused && own_done < std::min(own_count, own_limit)) {
        copy_own_piece(own_limit);
        moved = true;
      }
      for (Flow& f : ins) moved |= pull(f);
      if (!fused && !moved && own_done < std::min(own_count, idle_limit)) {
        copy_own_piece(idle_limit);
        moved = true;
      }
      if (!moved) moved = own_rows_ahead();
      if (all_finished()) break;
      if (moved) {
        idle = 0;
        if (armed) bell.cancel();
        armed = false;
        continue;
      }
      if (!armed) {
        // The deadline ends the spinning too: on a loaded machine a yield can take milliseconds,
        // and 256 of them outlasted the watchdog's grace, which then failed the call without the
        // ranks not arrived.
        const bool late = (crowded_ || idle % 32 == 0) && deadline.expired();
        if (++idle < kSpins && !late) {
          // With more ranks on this host than CPUs to run them, the peer this rank waits for may
          // be waiting for this CPU: give it up rather than spin (measured on 2 CPUs: 3 and 4
          // ranks' all_to_all 1.3-1.9x faster).
          if (crowded_) {
            ::sched_yield();
          } else {
            cpu_relax();
          }
          continue;
        }
        rung = bell.snapshot();  // then one more look before sleeping
        armed = true;
        continue;
      }
      // Nothing moved since the snapshot.
      if (deadline.expired()) {
        throw Timeout(fmt::format("all_to_all did not complete within {}; ranks not arrived: [{}]",
                                  format_duration(timeout), fmt::join(not_arrived(), ", ")));
      }
      for (const Flow& f : ins) {
        if (!f.finished() && f.peer->process.exited()) {
          throw PeerLost(
              fmt::format("all_to_all: rank {} (pid {}) exited before all its data "
                          "arrived",
                          f.peer->rank, f.peer->process.pid()));
        }
      }
      for (const Flow& f : outs) {
        if (!f.finished() && f.peer->process.exited()) {
          throw PeerLost(
              fmt::format("all_to_all: rank {} (pid {}) exited before taking all of "
                          "rank {}'s data",
                          f.peer->rank, f.peer->process.pid(), me));
        }
      }
      bell.sleep(rung, std::min(kNap, deadline.remaining()));
      armed = false;
      idle = 0;
    }
  } catch (...) {
    bell.cancel();
    shm_broken_ = true;
    throw;
  }
  bell.cancel();
}

uint8_t* GlooAllToAll::staging_for(size_t bytes) {
  if (bytes > staging_bytes_) {
    staging_.reset(new uint8_t[bytes]);  // default-initialized: no zero fill
    staging_bytes_ = bytes;
  }
  return staging_.get();
}

void GlooAllToAll::run(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                       uint64_t seq, Nanoseconds timeout, uint32_t phase) {
  const int n = context_->size, me = context_->rank;
  const Deadline deadline = Deadline::after(timeout);
  const int64_t element = static_cast<int64_t>(inputs[static_cast<size_t>(me)].element_size());
  const uint64_t call = call_id(seq, phase);
  const uint64_t slot = kAllToAllSlotPrefix | (call & ((uint64_t{1} << 56) - 1));
  auto bytes_of = [&](const Tensor& t) { return static_cast<size_t>(t.numel() * element); };
  auto peer_at = [&](int step, int direction) { return ((me + direction * step) % n + n) % n; };
  if (!shm_settled_) connect_shared_memory(seq, deadline, timeout);
  // A peer on this host goes through run_local, with this rank's own chunk; the rest over TCP.
  auto local = [&](int p) { return local_index_[static_cast<size_t>(p)] >= 0; };
  const bool any_local = !locals_.empty();

  // Step 1: where each peer's bytes leave from and arrive in: the view's own memory when it is
  // contiguous, a region of the staging memory otherwise.
  std::vector<Pieces> to(static_cast<size_t>(n)), from(static_cast<size_t>(n));
  std::vector<size_t> send_stage(static_cast<size_t>(n)), recv_stage(static_cast<size_t>(n));
  size_t staged = 0;
  for (int p = 0; p < n; ++p) {
    const Tensor& in = inputs[static_cast<size_t>(p)];
    const Tensor& out = outputs[static_cast<size_t>(p)];
    to[p].bytes = bytes_of(in);
    from[p].bytes = bytes_of(out);
    if (p == me || local(p)) continue;
    if (!in.is_contiguous()) {
      send_stage[p] = staged;
      staged += to[p].bytes;
    }
    if (!out.is_contiguous()) {
      recv_stage[p] = staged;
      staged += from[p].bytes;
    }
  }
  const Tensor& own_in = inputs[static_cast<size_t>(me)];
  const Tensor& own_out = outputs[static_cast<size_t>(me)];
  TESSEL_CHECK(to[me].bytes == from[me].bytes, InvalidArgument,
               "all_to_all: rank {} sends itself {} elements but receives {}", me, own_in.numel(),
               own_out.numel());
  const size_t bounce = staged;  // own chunk, both views strided: one piece at a time
  if (!own_in.is_contiguous() && !own_out.is_contiguous()) {
    staged += std::min(kPieceBytes, to[me].bytes);
  }
  uint8_t* stage = staging_for(staged);
  auto memory = [&](const Tensor& view, size_t stage_offset) {
    return view.is_contiguous() ? view.data_ptr() : stage + stage_offset;
  };

  // Step 2: every receive, piece by piece, before any send.
  std::vector<std::unique_ptr<Buffer>> recv_buffers(static_cast<size_t>(n));
  for (int step = 1; step < n; ++step) {
    const int p = peer_at(step, -1);
    if (from[p].bytes == 0 || local(p)) continue;
    recv_buffers[p] = context_->createUnboundBuffer(
        memory(outputs[static_cast<size_t>(p)], recv_stage[p]), from[p].bytes);
    for (int64_t k = 0; k < from[p].count(); ++k) {
      recv_buffers[p]->recv(p, slot, from[p].offset(k), from[p].length(k));
    }
  }

  // Step 3: sends, piece k to every peer (rank+1, rank+2, ...) and then piece k of this rank's
  // own chunk, for k = 0, 1, ...: a strided view's piece is packed just before it goes, and the
  // pieces of one round read the same rows of a strided input, which are then in cache.
  std::vector<std::unique_ptr<Buffer>> send_buffers(static_cast<size_t>(n));
  for (int step = 1; step < n; ++step) {
    const int p = peer_at(step, +1);
    if (to[p].bytes == 0 || local(p)) continue;
    send_buffers[p] = context_->createUnboundBuffer(
        memory(inputs[static_cast<size_t>(p)], send_stage[p]), to[p].bytes);
  }
  int64_t rounds = 0;
  for (int p = 0; p < n; ++p) {
    if (!local(p)) rounds = std::max({rounds, to[p].count(), from[p].count()});
  }
  for (int64_t k = 0; k < rounds; ++k) {
    for (int step = 1; step < n; ++step) {
      const int p = peer_at(step, +1);
      if (k >= to[p].count() || local(p)) continue;
      const Tensor& in = inputs[static_cast<size_t>(p)];
      if (!in.is_contiguous()) {
        pack_elements(in, static_cast<int64_t>(to[p].offset(k)) / element,
                      static_cast<int64_t>(to[p].length(k)) / element,
                      stage + send_stage[p] + to[p].offset(k));
      }
      send_buffers[p]->send(p, slot, to[p].offset(k), to[p].length(k));
    }
    if (!any_local && k < to[me].count()) {
      copy_own(own_in, own_out, static_cast<int64_t>(to[me].offset(k)) / element,
               static_cast<int64_t>(to[me].length(k)) / element, stage + bounce);
    }
  }

  if (any_local) run_local(inputs, outputs, call, stage + bounce, deadline, timeout);

  // Step 4: the receives, piece k from every peer in the order they send to us, for k = 0,
  // 1, ...; a staged piece is unpacked as soon as it is in. arrived[p] and left[p] count p's
  // pieces in and out.
  std::vector<int64_t> arrived(static_cast<size_t>(n), 0), left(static_cast<size_t>(n), 0);
  try {
    for (int64_t k = 0; k < rounds; ++k) {
      for (int step = 1; step < n; ++step) {
        const int p = peer_at(step, -1);
        if (k >= from[p].count() || local(p)) continue;
        if (!recv_buffers[p]->waitRecv(millis_left(deadline))) {
          throw CommError("all_to_all: a receive was aborted");
        }
        ++arrived[p];
        const Tensor& out = outputs[static_cast<size_t>(p)];
        if (!out.is_contiguous()) {
          unpack_elements(stage + recv_stage[p] + from[p].offset(k), out,
                          static_cast<int64_t>(from[p].offset(k)) / element,
                          static_cast<int64_t>(from[p].length(k)) / element);
        }
      }
    }
    // Step 5: every send has left.
    for (int step = 1; step < n; ++step) {
      const int p = peer_at(step, +1);
      if (local(p)) continue;
      for (; left[p] < to[p].count(); ++left[p]) {
        if (!send_buffers[p]->waitSend(millis_left(deadline))) {
          throw CommError("all_to_all: a send was aborted");
        }
      }
    }
  } catch (const ::gloo::IoException& e) {
    // Gloo's own wait gave up at the deadline; anything else (a lost peer) is the backend's to
    // translate.
    if (std::string_view(e.what()).find("Timed out") == std::string_view::npos) throw;
    throw_timeout(recv_buffers, from, arrived, timeout);
  }
}

}  // namespace tessel::internal
