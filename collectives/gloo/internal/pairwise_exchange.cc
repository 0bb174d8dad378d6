// The pairwise exchange: settling which peers share memory, and the exchange over Gloo's unbound
// buffers (TCP) with the others; the shared-memory side is in pairwise_exchange_shm.cc.

#include "tessel/collectives/gloo/internal/pairwise_exchange.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

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

// What identifies one exchange: the group's sequence number and the phase within that
// collective (reduce_scatter's rounds and all_reduce's gather under one number; 0 to 255).
constexpr uint64_t call_id(uint64_t seq, uint32_t phase) { return seq << 8 | (phase & 255u); }

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
  static constexpr size_t kPiece = PairwiseExchange::kPieceBytes;
  int64_t count() const { return static_cast<int64_t>((bytes + kPiece - 1) / kPiece); }
  size_t offset(int64_t k) const { return static_cast<size_t>(k) * kPiece; }
  size_t length(int64_t k) const { return std::min(kPiece, bytes - offset(k)); }
};

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

PairwiseExchange::PairwiseExchange(std::shared_ptr<::gloo::Context> context,
                                   SharedMemoryOptions shm)
    : context_(std::move(context)), shm_options_(std::move(shm)) {}

PairwiseExchange::~PairwiseExchange() = default;

void PairwiseExchange::copy_own(const Tensor& in, const Tensor& out, int64_t first, int64_t count,
                                uint8_t* bounce) {
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

std::vector<int> PairwiseExchange::shared_memory_peers() const {
  std::vector<int> out;
  for (const Local& l : locals_) out.push_back(l.rank);
  return out;
}

bool PairwiseExchange::group_may_share_memory(uint64_t seq, Nanoseconds timeout) {
  if (!shm_settled_) connect_shared_memory(seq, Deadline::after(timeout), timeout);
  return group_has_candidates_;
}

void PairwiseExchange::connect_shared_memory(uint64_t seq, const Deadline& deadline,
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
  // Ranks on this host: this group's, or the job's when the launcher says (local_world_size, from
  // LOCAL_WORLD_SIZE) and it is more: other groups' ranks compete for the CPUs too.
  const int on_host = std::max(static_cast<int>(locals_.size()) + 1, shm_options_.local_world_size);
  crowded_ = usable > 0 && on_host > usable;
  log_debug(LogComponent::kCollectives, "all_to_all: rank {} shares memory with ranks [{}]", me,
            fmt::join(shared_memory_peers(), ", "));
}

uint8_t* PairwiseExchange::staging_for(size_t bytes) {
  if (bytes > staging_bytes_) {
    staging_.reset(new uint8_t[bytes]);  // default-initialized: no zero fill
    staging_bytes_ = bytes;
  }
  return staging_.get();
}

void PairwiseExchange::run(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
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
