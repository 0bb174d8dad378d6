#pragma once
// The communication of tensor and sequence parallelism as differentiable functions, each with
// its dual in backward (Megatron-LM's "mappings"), so backward reads next to forward:
//
//   function                      forward                        backward
//   copy_to_tp_region             identity                       all_reduce (sum)
//   reduce_from_tp_region         all_reduce (sum)               identity
//   scatter_to_tp_region          keep this rank's piece of dim  all_gather along dim
//   gather_from_tp_region         all_gather along dim           keep this rank's piece
//   gather_from_sp_region         all_gather along dim           reduce_scatter along dim
//   reduce_scatter_to_sp_region   reduce_scatter along dim       all_gather along dim
//
// The convention behind the duals: an activation computed the same way on every rank of the
// group (replicated computation) has the same gradient on every rank; a piece of a split
// activation has the gradient of that piece; a tensor feeding a tensor-parallel matmul (a weight
// split across the group) receives one partial gradient per rank, summed by the dual of the
// function that made it (copy_to: all_reduce; gather_from_sp: reduce_scatter).
//
//   Tensor h = copy_to_tp_region(x, tp);                  // x: (B, T, C), the same everywhere
//   Tensor y = linear(h, w_rows);                          // this rank's output columns
//   Tensor z = reduce_from_tp_region(linear(gelu(y), w_cols), tp);
//
// Pieces follow torch.chunk (tessel::chunk_of). scatter_to_tp_region splits any size exactly
// (uneven pieces), and gather_from_tp_region does too when given the global size; otherwise the
// gathers take every piece to have this rank's size. Sequence shards are even:
// reduce_scatter_to_sp_region throws InvalidArgument, on every rank and before any
// communication, when the dimension is not a multiple of the group size.
//
// Collective rules: every rank of `group` calls the same functions in the same order with the
// same shapes (backward then runs their duals in reverse order, also on every rank). The
// tensors may be non-contiguous; results are contiguous. Blocking, on the calling thread.

#include <cstdint>
#include <memory>

#include "tessel/collectives/process_group.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

Tensor copy_to_tp_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& group);
Tensor reduce_from_tp_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& group);
Tensor scatter_to_tp_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                            int64_t dim);
// global_size: the size of `dim` after the gather (pieces chunk_of(global_size, ...), uneven
// allowed); -1: this rank's size times the group size.
Tensor gather_from_tp_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                             int64_t dim, int64_t global_size = -1);
Tensor gather_from_sp_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                             int64_t dim);
Tensor reduce_scatter_to_sp_region(const Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                                   int64_t dim);

// linear(gather_from_sp_region(x, group, dim), weight, bias) with the all_gather split in
// `chunks` asynchronous pieces along `dim`: this rank's own rows are multiplied while the pieces
// travel, then each piece as it arrives (torchtitan's async tensor parallelism, on a CPU the
// collective runs on the group's worker thread). In backward the reduce_scatter of the input's
// gradient runs while the weight's gradient is computed. Same values as the unsplit path up to
// float summation order (none: the products are the same, only assembled differently).
// `chunks` is clamped to [1, x.size(dim)]. Differentiable in x, weight and bias.
Tensor all_gather_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const std::shared_ptr<ProcessGroup>& group, int64_t dim, int64_t chunks);

}  // namespace tessel
