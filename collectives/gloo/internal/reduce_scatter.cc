// What the Gloo backend's reduce-scatter algorithms share: slots, the input's buffer, the
// reduction of two pieces, waits with a deadline, and the scratch kept between calls.

#include "tessel/collectives/gloo/internal/reduce_scatter.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include "tessel/base/error.h"
#include "tessel/collectives/internal/reduce.h"

namespace tessel::internal {
namespace {

// Slots of our reduce-scatter: prefix, 40 bits of the group sequence number, 16 of the step.
constexpr uint64_t kReduceScatterSlotPrefix = uint64_t{0x7d} << 56;

std::chrono::milliseconds to_millis(Nanoseconds d) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(d));
}

}  // namespace

ScatterScratch::ScatterScratch() = default;
ScatterScratch::~ScatterScratch() = default;

uint8_t* ScatterScratch::reserve(::gloo::Context& context, size_t bytes) {
  if (bytes > bytes_) {
    buffer_.reset();
    memory_.reset(new uint8_t[bytes]);  // default-initialized: no zero fill
    bytes_ = bytes;
    buffer_ = context.createUnboundBuffer(memory_.get(), bytes_);
  }
  return memory_.get();
}

uint64_t scatter_slot(uint64_t seq, int step) {
  return kReduceScatterSlotPrefix | ((seq & 0xffffffffffull) << 16) | static_cast<uint64_t>(step);
}

std::unique_ptr<::gloo::transport::UnboundBuffer> input_buffer(::gloo::Context& context,
                                                               const ScatterPlan& plan) {
  static uint8_t dummy = 0;
  return context.createUnboundBuffer(
      plan.offset.back() > 0 ? const_cast<uint8_t*>(plan.in) : &dummy,
      std::max<size_t>(plan.offset.back(), 1));
}

void combine(const ScatterPlan& plan, uint8_t* out, const uint8_t* a, const uint8_t* b,
             size_t bytes) {
  const auto count = static_cast<int64_t>(bytes / dtype_size(plan.dtype));
  reduce_pair(plan.dtype, plan.op, out, a, b, count);
}

void wait_recv(::gloo::transport::UnboundBuffer& buffer, const Deadline& deadline) {
  if (!buffer.waitRecv(to_millis(deadline.remaining()))) {
    throw CommError("reduce_scatter: a receive was aborted");
  }
}

void wait_send(::gloo::transport::UnboundBuffer& buffer, const Deadline& deadline) {
  if (!buffer.waitSend(to_millis(deadline.remaining()))) {
    throw CommError("reduce_scatter: a send was aborted");
  }
}

}  // namespace tessel::internal
