// Recursive-halving reduce-scatter over Gloo's point-to-point buffers, for power-of-two groups:
// log2 n steps; for small inputs, where latency matters.

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include "tessel/collectives/gloo/internal/reduce_scatter.h"

namespace tessel::internal {

// At distance d = n/2, n/4, ..., 1 a rank swaps half of its current chunk range with rank r ^ d
// (which holds the same range), keeps the half that contains chunk r and adds the partial sums
// it received to it.
void reduce_scatter_halving(::gloo::Context& context, const ScatterPlan& plan,
                            ScatterScratch& scratch_memory, uint64_t seq,
                            const Deadline& deadline) {
  const int n = context.size, r = context.rank;
  // [partial sums of the kept half][received half], each as large as the larger half; the
  // partial sums are addressed relative to the first kept chunk (`work_base`).
  const size_t half = std::max(plan.bytes(0, n / 2), plan.bytes(n / 2, n));
  uint8_t* scratch = scratch_memory.reserve(context, 2 * std::max<size_t>(half, 1));
  uint8_t* received = scratch + half;
  auto from_input = input_buffer(context, plan);
  auto& work = scratch_memory.buffer();
  const size_t work_base = plan.offset[(r & (n / 2)) != 0 ? n / 2 : 0];
  int lo = 0, hi = n, step = 0;
  bool sums_in_work = false;  // false: the current partial sums are the input itself
  for (int d = n / 2; d >= 1; d /= 2, ++step) {
    const int mid = lo + d;
    const bool upper = (r & d) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
    const int partner = r ^ d;
    const uint64_t slot = scatter_slot(seq, step);
    const size_t give_bytes = plan.bytes(give_lo, give_hi);
    const size_t keep_bytes = plan.bytes(keep_lo, keep_hi);
    if (give_bytes > 0) {
      if (sums_in_work) {
        work.send(partner, slot, plan.offset[give_lo] - work_base, give_bytes);
      } else {
        from_input->send(partner, slot, plan.offset[give_lo], give_bytes);
      }
    }
    if (keep_bytes > 0) {
      work.recv(partner, slot, received - scratch, keep_bytes);
      wait_recv(work, deadline);
      const uint8_t* mine = sums_in_work ? scratch + (plan.offset[keep_lo] - work_base)
                                         : plan.in + plan.offset[keep_lo];
      uint8_t* sum = d == 1 ? plan.out : scratch + (plan.offset[keep_lo] - work_base);
      combine(plan, sum, received, mine, keep_bytes);
    }
    if (give_bytes > 0) wait_send(sums_in_work ? work : *from_input, deadline);
    sums_in_work = true;
    lo = keep_lo;
    hi = keep_hi;
  }
}

}  // namespace tessel::internal
