// Ring reduce-scatter over Gloo's point-to-point buffers: n - 1 steps, each moving one chunk
// per rank; for large inputs, where bandwidth decides and the scratch stays small.

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include "tessel/collectives/gloo/internal/reduce_scatter.h"

namespace tessel::internal {

// In step s a rank sends one chunk's partial sum to its right neighbour and adds its own input
// to the chunk arriving from its left; chunk indices are chosen so that the last chunk it
// completes is its own.
void reduce_scatter_ring(::gloo::Context& context, const ScatterPlan& plan,
                         ScatterScratch& scratch_memory, uint64_t seq, const Deadline& deadline) {
  const int n = context.size, r = context.rank;
  size_t max_chunk = 0;
  for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, plan.bytes(c, c + 1));
  // [received chunk][partial A][partial B]: a partial is sent while the next is computed.
  uint8_t* scratch = scratch_memory.reserve(context, 3 * std::max<size_t>(max_chunk, 1));
  uint8_t* received = scratch;
  uint8_t* partial[2] = {scratch + max_chunk, scratch + 2 * max_chunk};
  auto from_input = input_buffer(context, plan);
  auto& work = scratch_memory.buffer();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int step = 0; step < n - 1; ++step) {
    const int send_chunk = ((r - step - 1) % n + n) % n;
    const int recv_chunk = ((r - step - 2) % n + n) % n;
    const uint64_t slot = scatter_slot(seq, step);
    const size_t send_bytes = plan.bytes(send_chunk, send_chunk + 1);
    const size_t recv_bytes = plan.bytes(recv_chunk, recv_chunk + 1);
    if (send_bytes > 0) {
      if (step == 0) {
        from_input->send(right, slot, plan.offset[send_chunk], send_bytes);
      } else {
        work.send(right, slot, partial[(step - 1) % 2] - scratch, send_bytes);
      }
    }
    if (recv_bytes > 0) {
      work.recv(left, slot, 0, recv_bytes);
      wait_recv(work, deadline);
      uint8_t* sum = step == n - 2 ? plan.out : partial[step % 2];
      combine(plan, sum, received, plan.in + plan.offset[recv_chunk], recv_bytes);
    }
    if (send_bytes > 0) wait_send(step == 0 ? *from_input : work, deadline);
  }
}

}  // namespace tessel::internal
