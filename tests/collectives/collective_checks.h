#pragma once
// Backend-independent checks of every collective, for the threads, gloo (forked processes) and
// MPI (mpirun) tests. Each check runs one collective on `pg` with values computed from (rank,
// index), computes the expected result locally, and compares element by element. A mismatch
// throws CheckFailure naming the collective, dtype, count, index and both values, so it works
// in rank threads, forked children and MPI ranks alike. `device` is where the tensors live (the
// threads backend takes CUDA tensors too); the expectations are the same on every device.

#include <stdexcept>
#include <vector>

#include "tessel/collectives/process_group.h"
#include "tessel/tensor/tensor.h"

namespace tessel::testing {

struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_all_reduce(ProcessGroup& pg, DType dtype, int64_t count, ReduceOp op,
                      Device device = Device::cpu());
void check_broadcast(ProcessGroup& pg, DType dtype, int64_t count, int root,
                     Device device = Device::cpu());
// uneven: rank r contributes count + r elements (count may be 0).
void check_all_gather(ProcessGroup& pg, DType dtype, int64_t count, bool uneven,
                      Device device = Device::cpu());
// uneven: rank r receives count + r elements of the result.
void check_reduce_scatter(ProcessGroup& pg, DType dtype, int64_t count, bool uneven, ReduceOp op,
                          Device device = Device::cpu());
// Rank r sends (count + j) elements to rank j.
void check_all_to_all(ProcessGroup& pg, DType dtype, int64_t count, Device device = Device::cpu());
// The list form over strided views: rank r sends rank j the (rows + r) x (8 + j) block of its
// columns; rank j's block arrives as contiguous rows or as a transposed slice.
void check_all_to_all_views(ProcessGroup& pg, DType dtype, int64_t rows);
// Every rank sends to rank+1 and receives from rank-1 (world size >= 2).
void check_send_recv_ring(ProcessGroup& pg, DType dtype, int64_t count,
                          Device device = Device::cpu());
// Splits into (rank % colors) groups keyed by -rank (reversed order), checks size, rank order
// and an all_reduce in each sub-group; with_no_color leaves the last rank out.
void check_split(ProcessGroup& pg, int colors, bool with_no_color, Device device = Device::cpu());

// Eight async all_reduces in flight at once, then waited in order: they run on the group's
// worker thread in issue order.
void check_async_batch(ProcessGroup& pg, DType dtype, int64_t count, Device device = Device::cpu());

// The 1M-element cases (1 << 20) in f32, bf16 and i64: all_reduce, broadcast and the send/recv
// ring of 1M elements; all_gather, reduce_scatter (uneven) and all_to_all (both forms) of about
// 1M in total.
void check_one_million(ProcessGroup& pg, Device device = Device::cpu());

// The sweep the acceptance asks for: every collective x dtypes {f32, bf16, i64} x counts.
void check_everything(ProcessGroup& pg, const std::vector<int64_t>& counts,
                      Device device = Device::cpu());
// Counts 0, 1, an odd one and (when `large`) 1M.
std::vector<int64_t> acceptance_counts(bool large);

}  // namespace tessel::testing
