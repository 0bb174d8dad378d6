#pragma once
// Private: the Gloo backend's all_to_all (gloo/gloo_all_to_all.cc), over Gloo's unbound buffers,
// for contiguous buffers and strided views alike.

#include <cstdint>
#include <memory>
#include <span>

#include "tessel/base/clock.h"
#include "tessel/tensor/tensor.h"

namespace gloo {
class Context;
}

namespace tessel::internal {

// All_to_all on one Gloo context. Every rank posts all its receives first, so a peer's send
// finds its receive waiting and goes out at once. Each peer's bytes travel in pieces of
// kPieceBytes; in round k a rank sends piece k to rank+1, rank+2, ... (packing a strided view's
// piece just before it goes, while earlier pieces are on the wire) and copies piece k of its own
// chunk straight into its output; a round reads one band of rows of a strided input, which the
// next piece then finds in cache. Then it takes the receives round by round, unpacking a
// strided view's piece as soon as it is in. Piece boundaries depend only on a pair's byte count,
// so its two ends agree whatever their views' shapes. Measured against packing into a ring of a
// few pieces per peer: slower, the sender then waits for the wire instead of packing ahead.
//
// Thread-safety: one call at a time (a backend runs its group's calls one at a time).
// Ownership: keeps the staging memory of strided views between calls (a fresh allocation per
// call page-faults).
class GlooAllToAll {
 public:
  static constexpr size_t kPieceBytes = size_t{256} << 10;

  explicit GlooAllToAll(std::shared_ptr<::gloo::Context> context);
  ~GlooAllToAll();

  // inputs[j] goes to rank j, outputs[j] receives rank j's inputs[rank]: CPU views of one dtype,
  // any strides, elements in row-major order; inputs[j].numel() must equal rank j's
  // outputs[rank].numel(). Blocks until all is sent and received. Throws Timeout naming the
  // ranks whose data had not all arrived within `timeout`; Gloo's own exceptions otherwise (a
  // lost peer), for the backend to translate.
  void run(std::span<const Tensor> inputs, std::span<const Tensor> outputs, uint64_t seq,
           Nanoseconds timeout);

 private:
  uint8_t* staging_for(size_t bytes);

  std::shared_ptr<::gloo::Context> context_;
  std::unique_ptr<uint8_t[]> staging_;
  size_t staging_bytes_ = 0;
};

}  // namespace tessel::internal
