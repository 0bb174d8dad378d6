// The shared-memory side of the pairwise exchange: one call's bytes to and from the peers on
// this host, through the rings of shm_channel.h (see PairwiseExchange's class comment).

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/context.h>

#include "tessel/base/error.h"
#include "tessel/collectives/gloo/internal/pairwise_exchange.h"
#include "tessel/collectives/internal/strided_copy.h"

namespace tessel::internal {
namespace {

constexpr size_t kRing = ShmRing::kRingBytes, kAlign = ShmRing::kAlign;
constexpr size_t kChunk = size_t{64} << 10;  // copied per step: a ring holds four
// How far this rank's own chunk may run ahead of the flows when it would otherwise wait.
constexpr size_t kAheadWhenIdle = size_t{512} << 10;
constexpr int kSpins = 256;  // idle steps before sleeping on the doorbell
constexpr Nanoseconds kNap = std::chrono::milliseconds(5);  // between checks for dead peers

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// The size rounded up to the rings' 64-byte grain.
constexpr size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// A call id (the sequence number << 8 | the phase) as errors name it.
std::string call_str(uint64_t call) {
  return call % 256 == 0 ? fmt::format("#{}", call >> 8)
                         : fmt::format("#{} (phase {})", call >> 8, call % 256);
}

// The record each call puts before its bytes in a ring (one 64-byte grain).
struct CallHeader {
  uint64_t call = 0;  // the call id
  uint64_t bytes = 0;
  int32_t from = -1;
};
static_assert(sizeof(CallHeader) <= kAlign);

}  // namespace

// One call with the peers on this host: a Flow per direction and peer, this rank's own chunk,
// and, where the views allow, split rows. step() moves whatever can move without waiting;
// run() steps until everything is through, spinning, yielding or sleeping on the doorbell
// while nothing moves.
class PairwiseExchange::LocalCall {
 public:
  LocalCall(PairwiseExchange& exchange, std::span<const Tensor> inputs,
            std::span<const Tensor> outputs, uint64_t call, uint8_t* bounce);

  // Blocks until every flow and the own chunk are done. Throws as PairwiseExchange::run.
  void run(const Deadline& deadline, Nanoseconds timeout);

 private:
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

  // How far the own chunk may go (elements): keeping pace with the flows, and while waiting.
  struct OwnLimits {
    int64_t pace;
    int64_t idle;
  };

  void plan_split_rows();
  bool step();
  bool push(Flow& f);
  bool pull(Flow& f);
  bool push_rows();
  bool own_rows_ahead();
  OwnLimits own_limits() const;
  void copy_own_piece(int64_t limit);
  bool all_finished() const;
  std::vector<int> not_arrived() const;
  void throw_if_peer_exited() const;
  [[noreturn]] void mismatch(int from, int to, uint64_t their_call, uint64_t sent,
                             uint64_t expected) const;

  PairwiseExchange& exchange_;
  const int me_;
  const size_t element_;
  const uint64_t call_;
  uint8_t* const bounce_;
  std::vector<Flow> outs_, ins_;
  const Tensor& own_in_;
  const Tensor& own_out_;
  const int64_t own_count_;
  int64_t own_done_ = 0;

  // Split rows: when every send and this rank's own block are column blocks of one matrix (the
  // same rows and pitch; a Shard(0) -> Shard(1) exchange) larger than this core's cache, and
  // its own output is contiguous, bands of the matrix's rows are read once each, every block
  // going to its ring or to the output in the same pass, instead of once per block. Sends move
  // whole rows then. (Measured as raw/ours against the contiguous call, split rows against
  // separate passes: 1.04-1.08x better at 16 and 64 MiB on 2 ranks, 1.09-1.16x on 4, but
  // 0.91-0.95x at 4 MiB on 2, a matrix the cache holds, where the separate passes stay.)
  bool fused_ = false;
  std::vector<RowRuns> layouts_;  // per send, then the own block
  std::vector<RowSink> sinks_;
  int64_t rows_done_ = 0;  // rows of every send
  int64_t own_rows_ = 0;   // rows of this rank's own block (rows_done_ or, while waiting, more)
  size_t own_run_elements_ = 0;
  size_t widest_ = 0;
};

PairwiseExchange::LocalCall::LocalCall(PairwiseExchange& exchange, std::span<const Tensor> inputs,
                                       std::span<const Tensor> outputs, uint64_t call,
                                       uint8_t* bounce)
    : exchange_(exchange),
      me_(exchange.context_->rank),
      element_(static_cast<size_t>(inputs[static_cast<size_t>(me_)].element_size())),
      call_(call),
      bounce_(bounce),
      own_in_(inputs[static_cast<size_t>(me_)]),
      own_out_(outputs[static_cast<size_t>(me_)]),
      own_count_(own_in_.numel()) {
  for (Local& l : exchange_.locals_) {
    const auto r = static_cast<size_t>(l.rank);
    outs_.push_back({&l, &inputs[r], static_cast<size_t>(inputs[r].numel()) * element_});
    outs_.back().seen = l.out->tail.load(std::memory_order_acquire);
    ins_.push_back({&l, &outputs[r], static_cast<size_t>(outputs[r].numel()) * element_});
    ins_.back().seen = l.in->head.load(std::memory_order_acquire);
  }
  plan_split_rows();
}

void PairwiseExchange::LocalCall::plan_split_rows() {
  fused_ = !outs_.empty() && own_out_.is_contiguous();
  for (size_t j = 0; fused_ && j <= outs_.size(); ++j) {
    const Tensor& view = j < outs_.size() ? *outs_[j].view : own_in_;
    const std::optional<RowRuns> l = row_runs(view);
    fused_ = l.has_value() && l->rows > 1 &&
             (layouts_.empty() || (l->rows == layouts_[0].rows && l->pitch == layouts_[0].pitch));
    if (fused_) layouts_.push_back(*l);
  }
  if (fused_) {
    fused_ = static_cast<size_t>(layouts_[0].rows * layouts_[0].pitch) > core_cache_bytes();
  }
  if (!fused_) layouts_.clear();
  sinks_.resize(layouts_.size());
  own_run_elements_ = fused_ ? layouts_.back().run / element_ : 0;
  for (const RowRuns& l : layouts_) widest_ = std::max(widest_, l.run);
}

// Both are the group's failure, not this rank's arguments: CommError, which the process group
// dumps for tessel-trace like a hang.
void PairwiseExchange::LocalCall::mismatch(int from, int to, uint64_t their_call, uint64_t sent,
                                           uint64_t expected) const {
  if (their_call != call_) {
    throw CommError(
        fmt::format("all_to_all {}: rank {} sent rank {} the data of its call "
                    "{}: the ranks' collectives on this group are out of step",
                    call_str(call_), from, to, call_str(their_call)));
  }
  throw CommError(
      fmt::format("all_to_all {}: rank {} sends {} bytes to rank {}, which "
                  "expects {} from it: the ranks passed different sizes",
                  call_str(call_), from, sent, to, expected));
}

// One send: its header first, then its bytes (or, with split rows, only its padding).
bool PairwiseExchange::LocalCall::push(Flow& f) {
  if (f.finished()) return false;
  ShmRing& r = *f.peer->out;
  if (r.fault.load(std::memory_order_acquire) != 0) {
    mismatch(me_, f.peer->rank, r.fault_call, r.fault_sent, r.fault_expected);
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
    const CallHeader h{call_, f.bytes, me_};
    std::memcpy(r.data + head % kRing, &h, sizeof(h));
    head += kAlign;
    space -= kAlign;
    f.header = moved = true;
    f.header_end = head;
  }
  if (!f.checked && tail >= f.header_end) f.checked = moved = true;
  const size_t at = head % kRing;
  // Split rows move a send's data (push_rows); here only its header and its padding.
  const size_t n = fused_ && f.done < f.bytes
                       ? 0
                       : std::min({space, align_up(f.bytes) - f.done, kRing - at, kChunk});
  if (n > 0) {
    const size_t data = f.done < f.bytes ? std::min(n, f.bytes - f.done) : 0;
    if (data > 0 && f.view->is_contiguous()) {
      std::memcpy(r.data + at, static_cast<const uint8_t*>(f.view->data_ptr()) + f.done, data);
    } else if (data > 0) {
      pack_elements(*f.view, static_cast<int64_t>(f.done / element_),
                    static_cast<int64_t>(data / element_), r.data + at);
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
}

// One receive: checks the header (a mismatch is flagged in the ring for the sender, then
// thrown here), then copies out what has arrived.
bool PairwiseExchange::LocalCall::pull(Flow& f) {
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
    if (h.call != call_ || h.bytes != f.bytes) {
      r.fault_call = h.call;
      r.fault_sent = h.bytes;
      r.fault_expected = f.bytes;
      r.fault.store(1, std::memory_order_release);
      ring_bell(f.peer->segment.header());
      mismatch(f.peer->rank, me_, h.call, h.bytes, f.bytes);
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
      unpack_elements(r.data + at, *f.view, static_cast<int64_t>(f.done / element_),
                      static_cast<int64_t>(data / element_));
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
}

// One band of split rows, as many as every ring has room for (at most a chunk's worth of the
// widest block), after every send's header.
bool PairwiseExchange::LocalCall::push_rows() {
  if (!fused_ || rows_done_ == layouts_[0].rows) return false;
  int64_t band = std::min<int64_t>(layouts_[0].rows - rows_done_,
                                   std::max<int64_t>(1, static_cast<int64_t>(kChunk / widest_)));
  for (size_t j = 0; j < outs_.size(); ++j) {
    Flow& f = outs_[j];
    if (!f.header) return false;
    ShmRing& r = *f.peer->out;
    const uint64_t head = r.head.load(std::memory_order_relaxed);
    const size_t want = static_cast<size_t>(band) * layouts_[j].run;
    if (kRing - static_cast<size_t>(head - f.seen) < want) {
      f.seen = r.tail.load(std::memory_order_acquire);
    }
    const size_t space = kRing - static_cast<size_t>(head - f.seen);
    band = std::min<int64_t>(band, static_cast<int64_t>(space / layouts_[j].run));
    sinks_[j] = {r.data, kRing, static_cast<size_t>(head % kRing), false};
  }
  if (band == 0) return false;
  // This rank's own block goes along unless it ran ahead while the rings were full; then the
  // band stops where the own block is, so they go together again from there.
  const bool with_own = own_rows_ == rows_done_;
  if (!with_own) band = std::min(band, own_rows_ - rows_done_);
  sinks_.back() = {static_cast<uint8_t*>(own_out_.data_ptr()), 0,
                   static_cast<size_t>(rows_done_) * layouts_.back().run,
                   worth_streaming(own_out_.nbytes())};
  const size_t n = with_own ? layouts_.size() : outs_.size();
  split_rows(std::span(layouts_).first(n), rows_done_, band, std::span(sinks_).first(n));
  for (size_t j = 0; j < outs_.size(); ++j) {
    Flow& f = outs_[j];
    ShmRing& r = *f.peer->out;
    const size_t moved = static_cast<size_t>(band) * layouts_[j].run;
    r.head.store(r.head.load(std::memory_order_relaxed) + moved, std::memory_order_release);
    f.done += moved;
    ring_bell(f.peer->segment.header());
  }
  rows_done_ += band;
  if (with_own) own_rows_ = rows_done_;
  own_done_ = own_rows_ * static_cast<int64_t>(own_run_elements_);
  return true;
}

// While the rings are full: this rank's own block alone, a band ahead, as far as
// kAheadWhenIdle (its rows are then read again for the sends, still in cache).
bool PairwiseExchange::LocalCall::own_rows_ahead() {
  if (!fused_ || own_rows_ == layouts_[0].rows) return false;
  const int64_t limit = std::min<int64_t>(
      layouts_[0].rows,
      rows_done_ + std::max<int64_t>(1, static_cast<int64_t>(kAheadWhenIdle) / layouts_[0].pitch));
  const int64_t band = std::min<int64_t>(
      limit - own_rows_, std::max<int64_t>(1, static_cast<int64_t>(kChunk / widest_)));
  if (band <= 0) return false;
  RowSink own{static_cast<uint8_t*>(own_out_.data_ptr()), 0,
              static_cast<size_t>(own_rows_) * layouts_.back().run,
              worth_streaming(own_out_.nbytes())};
  split_rows(std::span(layouts_).last(1), own_rows_, band, std::span(&own, 1));
  own_rows_ += band;
  own_done_ = own_rows_ * static_cast<int64_t>(own_run_elements_);
  return true;
}

// This rank's own chunk keeps pace with the flows that share its strided view (the sends when
// the input is strided, else the receives when the output is): its piece then covers the rows
// whose other columns they just read or wrote, still in cache. Waiting for the flows, it may run
// further ahead, as far as the rows still fit in cache.
PairwiseExchange::LocalCall::OwnLimits PairwiseExchange::LocalCall::own_limits() const {
  size_t frontier = 0;
  bool flows_left = false;
  for (const Flow& f : !own_in_.is_contiguous() ? outs_ : ins_) {
    if (f.finished() || (own_in_.is_contiguous() && own_out_.is_contiguous())) continue;
    flows_left = true;
    frontier = std::max(frontier, f.done);
  }
  if (!flows_left) return {own_count_, own_count_};
  return {static_cast<int64_t>((frontier + kChunk) / element_),
          static_cast<int64_t>((frontier + kAheadWhenIdle) / element_)};
}

void PairwiseExchange::LocalCall::copy_own_piece(int64_t limit) {
  const int64_t count = std::min<int64_t>(std::min(own_count_, limit) - own_done_,
                                          static_cast<int64_t>(kChunk / element_));
  copy_own(own_in_, own_out_, own_done_, count, bounce_);
  own_done_ += count;
}

// One pass: the sends, the own chunk at the flows' pace, the receives, then, when nothing else
// moved, the own chunk further ahead. Returns whether anything moved.
bool PairwiseExchange::LocalCall::step() {
  bool moved = false;
  for (Flow& f : outs_) moved |= push(f);
  moved |= push_rows();
  const OwnLimits limit = own_limits();  // before the receives move the frontier
  if (!fused_ && own_done_ < std::min(own_count_, limit.pace)) {
    copy_own_piece(limit.pace);
    moved = true;
  }
  for (Flow& f : ins_) moved |= pull(f);
  if (!fused_ && !moved && own_done_ < std::min(own_count_, limit.idle)) {
    copy_own_piece(limit.idle);
    moved = true;
  }
  if (!moved) moved = own_rows_ahead();
  return moved;
}

bool PairwiseExchange::LocalCall::all_finished() const {
  auto done = [](const Flow& f) { return f.finished(); };
  return own_done_ == own_count_ && std::all_of(outs_.begin(), outs_.end(), done) &&
         std::all_of(ins_.begin(), ins_.end(), done);
}

// Ranks to name when the deadline passes: those whose data has not all arrived, else those
// that have not taken all of ours.
std::vector<int> PairwiseExchange::LocalCall::not_arrived() const {
  std::vector<int> missing;
  for (const Flow& f : ins_) {
    if (!f.finished()) missing.push_back(f.peer->rank);
  }
  if (missing.empty()) {
    for (const Flow& f : outs_) {
      if (!f.finished()) missing.push_back(f.peer->rank);
    }
  }
  return missing;
}

void PairwiseExchange::LocalCall::throw_if_peer_exited() const {
  for (const Flow& f : ins_) {
    if (!f.finished() && f.peer->process.exited()) {
      throw PeerLost(
          fmt::format("all_to_all: rank {} (pid {}) exited before all its data "
                      "arrived",
                      f.peer->rank, f.peer->process.pid()));
    }
  }
  for (const Flow& f : outs_) {
    if (!f.finished() && f.peer->process.exited()) {
      throw PeerLost(
          fmt::format("all_to_all: rank {} (pid {}) exited before taking all of "
                      "rank {}'s data",
                      f.peer->rank, f.peer->process.pid(), me_));
    }
  }
}

void PairwiseExchange::LocalCall::run(const Deadline& deadline, Nanoseconds timeout) {
  Doorbell bell(exchange_.own_.header());
  bool armed = false;
  uint32_t rung = 0;
  int idle = 0;
  try {
    while (true) {
      const bool moved = step();
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
        const bool late = (exchange_.crowded_ || idle % 32 == 0) && deadline.expired();
        if (++idle < kSpins && !late) {
          // With more ranks on this host than CPUs to run them, the peer this rank waits for may
          // be waiting for this CPU: give it up rather than spin (measured on 2 CPUs: 3 and 4
          // ranks' all_to_all 1.3-1.9x faster).
          if (exchange_.crowded_) {
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
      throw_if_peer_exited();
      bell.sleep(rung, std::min(kNap, deadline.remaining()));
      armed = false;
      idle = 0;
    }
  } catch (...) {
    bell.cancel();
    throw;
  }
  bell.cancel();
}

void PairwiseExchange::run_local(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                                 uint64_t call, uint8_t* bounce, const Deadline& deadline,
                                 Nanoseconds timeout) {
  TESSEL_CHECK(!shm_broken_, CommError,
               "all_to_all: an earlier all_to_all on this group failed and left its "
               "shared-memory channels out of step; create the group again");
  LocalCall local(*this, inputs, outputs, call, bounce);
  try {
    local.run(deadline, timeout);
  } catch (...) {
    shm_broken_ = true;
    throw;
  }
}

}  // namespace tessel::internal
