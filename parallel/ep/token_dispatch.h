#pragma once
// Expert parallelism's token dispatcher: the routed rows of an MoE layer travel to the ranks of
// the ep group that hold their experts and come back, by all-to-alls of uneven splits whose
// sizes are exchanged first (torchtitan's and Megatron's all-to-all dispatcher).
//
//   forward                                          backward (the duals, in reverse)
//   1. all_to_all of the E per-expert row counts     -
//   2. all_to_all of the rows (uneven splits)        all_to_all of the gradient, splits swapped
//   3. regroup rows by local expert (a gather)       scatter back
//   ... the local experts' grouped matmuls ...
//   4. regroup by source rank (the inverse gather)   scatter back
//   5. all_to_all of the outputs (splits swapped)    all_to_all of the gradient, as in 2
//
// and, for the load statistics, one all_reduce of the E counts over the data-parallel ranks.
// With an ep group of one rank nothing is exchanged (only the counts are summed): the way to
// keep routing and the balancing bias those of one process under plain data parallelism.

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/collectives/process_group.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/moe.h"
#include "tessel/tensor/tensor.h"

namespace tessel {

// x (R, ...) rows -> the rows the group's ranks send here: send_rows[j] of x's rows (in order)
// go to group rank j, recv_rows[s] rows arrive from rank s and are stacked in rank order.
// Differentiable: backward is the all_to_all of the gradient with the splits swapped. Every rank
// of `group` calls it with matching splits (send_rows[j] on rank i == recv_rows[i] on rank j).
// Blocking. Throws InvalidArgument when the splits do not have group->size() entries or
// send_rows does not sum to x's rows.
Tensor all_to_all_rows(const Tensor& x, const std::shared_ptr<ProcessGroup>& group,
                       const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows);

// What expert parallelism's communication cost, summed over a model's MoE layers.
struct ExpertParallelStats {
  int64_t all_to_alls = 0;  // issued: the counts' and the rows' (forward and backward)
  int64_t bytes_sent = 0;   // rows' bytes this rank sent to other ranks
  std::chrono::duration<double> all_to_all_time{0};  // host time spent in those calls
  ExpertParallelStats& operator+=(const ExpertParallelStats& o);
};

// The nn::MoEDispatcher of one MoE layer under expert parallelism: this rank holds experts
// [ep_rank * E / ep, (ep_rank + 1) * E / ep). The groups are taken from the meshes on the
// first forward (a collective over the world, as any mesh group's creation).
// Thread-safety: used by the thread running the model. Ownership: the MoE layer holds it.
class AllToAllDispatcher : public nn::MoEDispatcher {
 public:
  // `ep`: the expert-parallel mesh (1-D; its size must divide num_experts, else
  // InvalidArgument); `data`: the (1-D) mesh of every rank holding other tokens, over which the
  // counts are summed. No communication.
  AllToAllDispatcher(int64_t num_experts, DeviceMesh ep, DeviceMesh data);

  std::vector<int64_t> global_counts(const std::vector<int64_t>& local) override;
  Tensor dispatch(const Tensor& xs, const std::vector<int64_t>& counts,
                  std::vector<int64_t>* offsets) override;
  Tensor combine(const Tensor& ys) override;
  double expert_grad_scale() const override { return 1.0 / static_cast<double>(ep_mesh_.size()); }

  // Totals since construction or the last reset_stats() (backward's all-to-alls included).
  ExpertParallelStats stats() const { return *stats_; }
  void reset_stats() { *stats_ = {}; }

 private:
  void make_groups();

  int64_t num_experts_;
  DeviceMesh ep_mesh_, data_mesh_;
  std::shared_ptr<ProcessGroup> ep_, data_;  // made on the first forward
  // Shared with the backward closures of the all-to-alls, which may outlive a forward.
  std::shared_ptr<ExpertParallelStats> stats_;
  // The last dispatch's splits and regrouping, for its combine.
  std::vector<int64_t> send_rows_, recv_rows_, by_source_;
};

}  // namespace tessel
