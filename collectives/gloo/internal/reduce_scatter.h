#pragma once
// Private: the Gloo backend's reduce-scatter algorithms, one per file (Gloo's collectives API
// has none): reduce_scatter_ring.cc, reduce_scatter_halving.cc over Gloo's point-to-point
// buffers, and reduce_scatter_exchange.cc over the pairwise exchange, for groups whose ranks
// share a host. Here: what they take and share. reduce_scatter.cc holds the shared helpers.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/base/reduce_op.h"
#include "tessel/collectives/gloo/internal/pairwise_exchange.h"
#include "tessel/tensor/dtype.h"
#include "tessel/tensor/tensor.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace tessel::internal {

// What the ring and halving algorithms work from. Chunk c of the input is bytes
// [offset[c], offset[c + 1]); the result is this rank's chunk, in `out`.
struct ScatterPlan {
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // avg is summed, then divided by the caller
  std::vector<size_t> offset;
  size_t bytes(int first, int last) const { return offset[last] - offset[first]; }
};

// Scratch memory kept between calls, with a Gloo buffer over it: calls on a backend never
// overlap (its group runs one at a time), and a fresh allocation per call page-faults
// (measured: a quarter of a 4 MiB reduce_scatter). Not thread-safe; owns both.
class ScatterScratch {
 public:
  ScatterScratch();
  ~ScatterScratch();
  ScatterScratch(const ScatterScratch&) = delete;
  ScatterScratch& operator=(const ScatterScratch&) = delete;

  // At least `bytes` of scratch (its buffer made on `context` when it grows).
  uint8_t* reserve(::gloo::Context& context, size_t bytes);
  // The Gloo buffer over the scratch (valid after reserve()).
  ::gloo::transport::UnboundBuffer& buffer() { return *buffer_; }

 private:
  std::unique_ptr<uint8_t[]> memory_;
  size_t bytes_ = 0;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer_;  // over memory_
};

// Ring: n - 1 steps, three chunks of scratch; for bandwidth. Blocks; throws Gloo's exceptions
// (the backend translates them) and CommError for an aborted send or receive.
void reduce_scatter_ring(::gloo::Context& context, const ScatterPlan& plan, ScatterScratch& scratch,
                         uint64_t seq, const Deadline& deadline);

// Recursive halving: log2 n steps for a power-of-two group, scratch as large as the input; for
// latency. Blocks; throws as reduce_scatter_ring.
void reduce_scatter_halving(::gloo::Context& context, const ScatterPlan& plan,
                            ScatterScratch& scratch, uint64_t seq, const Deadline& deadline);

// Reduce-scatter as pairwise exchanges: chunk j of every rank's `flat_in` goes to rank j, which
// reduces the pieces in rank order into `out` (a 1-D contiguous tensor of counts[rank]
// elements, which may be this rank's own chunk of flat_in: all_reduce's first half). The peers'
// pieces are held in scratch of about `scratch_bytes`: larger chunks go in rounds (one exchange
// each, phases 0, 1, ...), every rank cutting them alike. Returns the number of phases used.
// Blocks; throws as PairwiseExchange::run.
uint32_t reduce_scatter_exchange(PairwiseExchange& exchange, int rank, int size,
                                 const Tensor& flat_in, std::span<const int64_t> counts,
                                 const Tensor& out, ReduceOp op, uint64_t seq, Nanoseconds timeout,
                                 size_t scratch_bytes);

// Shared by the ring and halving algorithms.
uint64_t scatter_slot(uint64_t seq, int step);
// A Gloo buffer over the plan's input: Gloo only reads what it sends, so the (const) input can
// be a send buffer.
std::unique_ptr<::gloo::transport::UnboundBuffer> input_buffer(::gloo::Context& context,
                                                               const ScatterPlan& plan);
// out = a (op) b over `bytes` of the plan's dtype.
void combine(const ScatterPlan& plan, uint8_t* out, const uint8_t* a, const uint8_t* b,
             size_t bytes);
// Waits for one receive / send on `buffer` until the deadline; CommError when it was aborted.
void wait_recv(::gloo::transport::UnboundBuffer& buffer, const Deadline& deadline);
void wait_send(::gloo::transport::UnboundBuffer& buffer, const Deadline& deadline);

}  // namespace tessel::internal
