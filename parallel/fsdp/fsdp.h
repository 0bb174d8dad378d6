#pragma once
// Fully sharded data parallelism (FSDP, ZeRO-3) on a DeviceMesh, with PyTorch FSDP2's
// semantics:
//
//   DeviceMesh mesh = init_device_mesh(world, {world->size()}, {"dp"});
//   for (size_t i = 0; i < blocks.size(); ++i) fully_shard(blocks[i], mesh);   // each block
//   fully_shard(model, mesh);                                                   // then the root
//   AdamW opt(model.parameters(), {...});      // the parameters are now this rank's shards
//   for (...) { backward(loss_of(model(x))); clip_grad_norm(model.parameters(), 1.0); opt.step(); }
//
// Each fully_shard call makes one parameter group of the module's parameters not already
// managed by a fully_shard'ed descendant. Every parameter is sharded on dim 0 over the mesh's
// shard dimension (torch.chunk's sizes: uneven and empty shards are exact); outside forward and
// backward the module's parameter slots hold the shards (f32 "master" parameters, the tensors
// the optimizer steps; each is a DTensor: see as_dtensor() in dtensor.h). Before the group's
// forward and backward, one flat all_gather per group fills the unsharded parameters (releasable
// storage: freed after use while autograd keeps its views); each group's gradients leave in one
// flat reduce_scatter (average over the shard dimension; then an all_reduce over the replicate
// dimension for HSDP) as soon as they are complete in backward.
//
// With tensor parallelism (parallelize_module first, over another dimension of the same mesh):
// a parameter the plan split is a DTensor on the tp mesh; FSDP shards its local tensor on dim 0
// the same way and records the spec on the joined mesh (DeviceMesh::join), tp splitting first —
// a column-parallel weight on (dp, tp) is (Shard(0), Shard(0)) with shard order {tp, dp} — so
// as_dtensor, the state dicts (state_dict.h) and clip_grad_norm (clip_grad_norm.h) see both
// dimensions.
//
// Overlap: after the first step, which records the groups' forward order, each group's
// pre-forward issues the next group's all_gather asynchronously, and backward prefetches in
// reverse order; reductions run asynchronously too and are waited for at the end of backward
// (autograd's queue_callback). On the CPU the collectives run on each group's worker thread;
// on CUDA over NCCL on the group's communication stream, and a wait makes the compute stream
// wait for them without blocking the host (docs/parallel-cuda.md; not yet run on a GPU).
//
// Collective rules: the first forward of the root validates, over the mesh, that every rank
// has the same sharded parameters (names, shapes, dtypes) and fails with one error naming the
// first that differs, on every rank, before any gather. Every rank runs forward and backward of
// the same modules in the same order (as for any collective). Thread-safety: a model under FSDP
// is used by one thread at a time.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/module.h"

namespace tessel {

// Mixed precision: parameters are gathered and used in param_dtype, gradients are reduced in
// reduce_dtype, the root's floating outputs are cast to output_dtype; the sharded parameters
// (and their gradients and optimizer state) stay f32. Unset: as the parameters are.
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<DType> output_dtype;
};

struct FullyShardOptions {
  // true: free the unsharded parameters after forward and gather them again for backward
  // (ZeRO-3); false: keep them until after backward (ZeRO-2; the root always does); an integer
  // N > 1: keep an N-way shard after forward (gathered within groups of N ranks in backward).
  std::variant<bool, int64_t> reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  // The mesh dimension to shard over; empty: the mesh's last dimension.
  std::string shard_dim;
  // HSDP: the dimension parameters are replicated over (gradients all_reduced across it);
  // empty: for a 2-D mesh, the dimension that is not shard_dim; none for a 1-D mesh.
  std::string replicate_dim;
};

// What a group's communication cost, for tests and benchmarks.
struct FSDPStats {
  int64_t all_gathers = 0;      // flat all_gathers issued
  int64_t reduce_scatters = 0;  // flat reduce_scatters issued
  int64_t all_reduces = 0;      // HSDP all_reduces issued
  int64_t prefetched = 0;       // all_gathers issued ahead of the group's own need
  // Host time the caller waited for this group's collectives. Over NCCL a wait only makes the
  // compute stream wait, so this stays near zero whatever the device does.
  double exposed_wait_s = 0;
};

// The handle of a fully_shard'ed module (owned by the module; valid while it lives).
class FSDPModule {
 public:
  virtual ~FSDPModule() = default;
  virtual nn::Module& module() = 0;
  // Gathers the unsharded parameters now (async: issue the all_gather and return; the next
  // forward waits for it) / frees them and puts the shards back in the slots.
  virtual void unshard(bool async = false) = 0;
  virtual void reshard() = 0;
  // false: backward keeps accumulating unsharded gradients locally, with no communication, until
  // a backward with sync on reduces their sum (gradient accumulation).
  virtual void set_requires_gradient_sync(bool on) = 0;
  // HSDP, false: reduce_scatter within each replica but skip the all_reduce across replicas
  // (the sharded gradients accumulate per replica) until it is set again.
  virtual void set_requires_all_reduce(bool on) = 0;
  // false: the end of backward keeps this module's groups unsharded (a pipeline stage running
  // several micro-batches' backward in one step gathers once); true (the default) frees them.
  // A backward that reduce-scatters (sync on) still frees them.
  virtual void set_reshard_after_backward(bool on) = 0;
  // Explicit prefetch lists (e.g. for experts): these modules' all_gathers are issued at this
  // module's pre-forward / pre-backward instead of the recorded order's next one.
  virtual void set_modules_to_forward_prefetch(std::vector<FSDPModule*> modules) = 0;
  virtual void set_modules_to_backward_prefetch(std::vector<FSDPModule*> modules) = 0;
  virtual FSDPStats stats() const = 0;
};

// Shards `module`'s parameters over `mesh` (see above). Throws InvalidArgument when the module
// is already fully_shard'ed, when the mesh has no dimension named shard_dim/replicate_dim or
// more than two dimensions, or for a reshard_after_forward group size that does not divide the
// shard dimension. No communication (groups are made on first use).
FSDPModule& fully_shard(nn::Module& module, const DeviceMesh& mesh,
                        const FullyShardOptions& options = {});

// The FSDP handle of `module`, or null when it was not fully_shard'ed.
FSDPModule* fsdp_module(nn::Module& module);

}  // namespace tessel
