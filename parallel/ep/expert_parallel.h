#pragma once
// Expert parallelism: the experts of every MoE layer sharded over the mesh's `ep` dimension,
// tokens dispatched to them and combined back by all-to-alls (token_dispatch.h), as torchtitan
// does for DeepSeek-V3 and Qwen3-MoE:
//
//   DeviceMesh mesh = init_device_mesh(world, {8}, {"dp_shard"});
//   DeviceMesh moe_mesh = carve_ep_mesh(mesh, 4);        // (efsdp=2, ep=4) over the same ranks
//   ExpertParallel ep = parallelize_experts(model, moe_mesh);      // before fully_shard
//   for (nn::MoE* moe : ep.layers()) fully_shard(moe->child("experts"), moe_mesh["efsdp"]);
//   DeviceMesh dp = moe_mesh.flatten({"efsdp", "ep"}, "dp_shard")["dp_shard"];   // 1-D
//   for (auto& layer : layers) fully_shard(layer, dp);
//   fully_shard(model, dp);
//   ... train: each rank feeds its own rows (rank r of the flattened dp_shard) ...
//   ep.stats();                                           // all-to-all count, bytes, time
//
// Each ep rank holds E / ep experts: the MoE's stacked expert weights (E, C, F) become the
// rank's (E / ep, C, F) piece with a DTensor spec Shard(0) on the ep mesh, so FSDP shards them
// further over what remains (efsdp; the spec joins both dimensions) and checkpoints reshard them
// onto any other ep degree. The router, the shared experts and every dense layer stay
// replicated over ep (FSDP over the whole dp_shard, tensor parallelism over tp as usual).
//
// Gradients are the ones one process computes for the whole batch: the all-to-all's backward
// sums the ep ranks' contributions to each expert, the experts' gradients are scaled by 1 / ep
// so that FSDP's average over efsdp completes the data-parallel mean, and the per-expert counts
// (load statistics, the auxiliary loss's f, the balancing bias) are summed over the data
// ranks so that every rank routes as one process would.
//
// Every check runs before anything changes and needs no communication, so bad input fails on
// every rank with the same InvalidArgument. Thread-safety: none (the model is used by one
// thread).

#include <memory>
#include <string>
#include <vector>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/module.h"
#include "tessel/nn/moe.h"
#include "tessel/parallel/ep/token_dispatch.h"

namespace tessel {

// `mesh` with dimension `from` (default "dp_shard") unflattened into (efsdp = size / ep, ep):
// the ep ranks adjacent, as torchtitan lays them out. Throws InvalidArgument naming the sizes
// when ep < 1, the mesh has no dimension `from`, or ep does not divide it. No communication.
DeviceMesh carve_ep_mesh(const DeviceMesh& mesh, int64_t ep, const std::string& from = "dp_shard");

struct ExpertParallelOptions {
  std::string ep_dim = "ep";
  // The mesh dimensions whose ranks hold other tokens (their per-expert counts are summed);
  // empty: every dimension except "tp" and "pp".
  std::vector<std::string> data_dims = {};
};

// The handle parallelize_experts returns: the MoE layers it changed and their dispatchers.
class ExpertParallel {
 public:
  const std::vector<nn::MoE*>& layers() const { return layers_; }
  // All-to-all totals over the layers (since the start or the last reset_stats()).
  ExpertParallelStats stats() const;
  void reset_stats();
  int64_t ep() const { return ep_; }

 private:
  friend ExpertParallel parallelize_experts(nn::Module&, const DeviceMesh&,
                                            const ExpertParallelOptions&);
  int64_t ep_ = 1;
  std::vector<nn::MoE*> layers_;
  std::vector<std::shared_ptr<AllToAllDispatcher>> dispatchers_;
};

// Shards the experts of every nn::MoE in `model` over mesh dimension options.ep_dim and
// installs the all-to-all dispatcher (see above). Apply it before fully_shard. Throws
// InvalidArgument, changing nothing, when the mesh has no ep (or a named data) dimension, the
// model has no MoE layer, a layer's expert count does not divide over ep, top_k exceeds the
// expert count, a layer has a capacity factor (expert parallelism is dropless), or an expert
// weight is already a shard (FSDP or tensor parallelism applied first). No communication.
ExpertParallel parallelize_experts(nn::Module& model, const DeviceMesh& mesh,
                                   const ExpertParallelOptions& options = {});

}  // namespace tessel
