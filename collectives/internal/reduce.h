#pragma once
// Element-wise reductions over raw buffers of any tensor dtype, shared by the CPU backends
// (threads, gloo's custom reduce functions, MPI's user ops). bf16 and f16 accumulate in f32 and
// round once per pairwise step, as the transports do.

#include <cstdint>

#include "tessel/collectives/process_group.h"
#include "tessel/tensor/dtype.h"

namespace tessel::internal {

// acc[i] = acc[i] (op) src[i] for i < count. kAvg reduces as kSum. bool: sum/max are "or",
// product/min are "and".
void reduce_into(DType dtype, ReduceOp op, void* acc, const void* src, int64_t count);
// out[i] = a[i] (op) b[i]; out may alias a or b.
void reduce_pair(DType dtype, ReduceOp op, void* out, const void* a, const void* b, int64_t count);
// data[i] /= divisor (integer division for integer dtypes; no-op for bool).
void divide_by(DType dtype, void* data, int64_t count, int64_t divisor);

}  // namespace tessel::internal
