#include "tessel/collectives/internal/gloo_all_to_all.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "tessel/base/error.h"
#include "tessel/collectives/internal/strided_copy.h"

namespace tessel::internal {
namespace {

using Buffer = ::gloo::transport::UnboundBuffer;

// Slots of our all_to_all: a prefix and 56 bits of the group sequence number.
constexpr uint64_t kAllToAllSlotPrefix = uint64_t{0x7c} << 56;

// Time left, rounded up: Gloo's wait then gives up no earlier than the deadline.
std::chrono::milliseconds millis_left(const Deadline& deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining()));
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
    pack_elements(in, first, count, static_cast<uint8_t*>(out.data_ptr()) + first * element);
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
      while (arrived[p] < from[p].count() && recv_buffers[p]->waitRecv(std::chrono::milliseconds(1))) {
        ++arrived[p];
      }
    } catch (const ::gloo::Exception&) {
    }
    if (arrived[p] < from[p].count()) missing.push_back(static_cast<int>(p));
  }
  if (missing.empty()) {
    throw Timeout(fmt::format("all_to_all: every piece arrived but the sends did not complete "
                              "within {}", format_duration(timeout)));
  }
  throw Timeout(fmt::format("all_to_all did not complete within {}; ranks not arrived: [{}]",
                            format_duration(timeout), fmt::join(missing, ", ")));
}

}  // namespace

GlooAllToAll::GlooAllToAll(std::shared_ptr<::gloo::Context> context)
    : context_(std::move(context)) {}

GlooAllToAll::~GlooAllToAll() = default;

uint8_t* GlooAllToAll::staging_for(size_t bytes) {
  if (bytes > staging_bytes_) {
    staging_.reset(new uint8_t[bytes]);  // default-initialized: no zero fill
    staging_bytes_ = bytes;
  }
  return staging_.get();
}

void GlooAllToAll::run(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                       uint64_t seq, Nanoseconds timeout) {
  const int n = context_->size, me = context_->rank;
  const Deadline deadline = Deadline::after(timeout);
  const int64_t element = static_cast<int64_t>(inputs[static_cast<size_t>(me)].element_size());
  const uint64_t slot = kAllToAllSlotPrefix | (seq & ((uint64_t{1} << 56) - 1));
  auto bytes_of = [&](const Tensor& t) { return static_cast<size_t>(t.numel() * element); };
  auto peer_at = [&](int step, int direction) { return ((me + direction * step) % n + n) % n; };

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
    if (p == me) continue;
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
               "all_to_all: rank {} sends itself {} elements but receives {}", me,
               own_in.numel(), own_out.numel());
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
    if (from[p].bytes == 0) continue;
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
    if (to[p].bytes == 0) continue;
    send_buffers[p] = context_->createUnboundBuffer(
        memory(inputs[static_cast<size_t>(p)], send_stage[p]), to[p].bytes);
  }
  int64_t rounds = 0;
  for (int p = 0; p < n; ++p) rounds = std::max({rounds, to[p].count(), from[p].count()});
  for (int64_t k = 0; k < rounds; ++k) {
    for (int step = 1; step < n; ++step) {
      const int p = peer_at(step, +1);
      if (k >= to[p].count()) continue;
      const Tensor& in = inputs[static_cast<size_t>(p)];
      if (!in.is_contiguous()) {
        pack_elements(in, static_cast<int64_t>(to[p].offset(k)) / element,
                      static_cast<int64_t>(to[p].length(k)) / element,
                      stage + send_stage[p] + to[p].offset(k));
      }
      send_buffers[p]->send(p, slot, to[p].offset(k), to[p].length(k));
    }
    if (k < to[me].count()) {
      copy_own(own_in, own_out, static_cast<int64_t>(to[me].offset(k)) / element,
               static_cast<int64_t>(to[me].length(k)) / element, stage + bounce);
    }
  }

  // Step 4: the receives, piece k from every peer in the order they send to us, for k = 0,
  // 1, ...; a staged piece is unpacked as soon as it is in. arrived[p] and left[p] count p's
  // pieces in and out.
  std::vector<int64_t> arrived(static_cast<size_t>(n), 0), left(static_cast<size_t>(n), 0);
  try {
    for (int64_t k = 0; k < rounds; ++k) {
      for (int step = 1; step < n; ++step) {
        const int p = peer_at(step, -1);
        if (k >= from[p].count()) continue;
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
