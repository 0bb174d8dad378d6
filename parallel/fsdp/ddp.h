#pragma once
// replicate(): data parallelism with replicated parameters (PyTorch's DistributedDataParallel and
// its composable `replicate`). Every rank of the mesh's data-parallel group holds the whole model
// and a slice of the batch; after each backward pass every parameter's gradient is the average of
// the ranks' gradients, so the replicas take the same optimizer step and stay equal.
//
//   nn::GPT model(config);                                   // the same on every rank
//   DeviceMesh mesh = init_device_mesh(world, {world->size()}, {"dp"});
//   DDPModule ddp = replicate(model, mesh);                  // checks, then syncs from rank 0
//   for (...) {
//     Tensor loss = nn::GPT::loss(ddp(x), y);                // this rank's slice of the batch
//     backward(loss);                                        // returns with averaged gradients
//     opt.step();
//     opt.zero_grad();
//   }
//   { auto guard = ddp.no_sync(); backward(nn::GPT::loss(ddp(x1), y1)); }  // accumulate locally
//   backward(nn::GPT::loss(ddp(x2), y2));                    // averages the accumulated sum
//
// How the averaging overlaps backward: gradients are packed into buckets of about
// ReplicateOptions::bucket_bytes, filled in reverse parameter order (the order in which backward
// finishes them). A post-accumulate-grad hook on each parameter marks it ready; when a bucket's
// parameters are all ready, it is copied into a flat buffer and its all_reduce (average) starts
// asynchronously while backward goes on with earlier layers. Buckets start strictly in index
// order, so every rank issues the same collectives in the same order whatever its hooks' order.
// At the end of backward (a queue_callback) the buckets still waiting — those holding a parameter
// that got no gradient in this pass — start, every bucket is waited for, and the averages are
// copied back into the gradients.
//
// Unused parameters need no option: a parameter without a gradient in this pass contributes zeros
// and holds up only its own bucket until the end of backward. Each bucket carries one "has a
// gradient" element per parameter, averaged with the gradients, so a parameter that no rank gave
// a gradient keeps an undefined gradient (as in single-process training), and one that only some
// ranks used gets the average on every rank.
//
// Gradient accumulation: with set_requires_gradient_sync(false) (or inside no_sync()) backward
// communicates nothing and gradients accumulate locally; the next synced backward averages the
// accumulated sums. The setting in force when the module's forward runs applies to the backward
// of that forward (as PyTorch's no_sync), so `backward(loss)` may follow the guard's scope.
// Several synced backward passes in one step (several losses) each average what has accumulated;
// since averaging is linear, the result is the sum of the averaged gradients.
//
// Construction checks, with one all_reduce over the group (and two all_gathers only on a
// mismatch), that every rank holds the same parameters and buffers (names, shapes, dtypes,
// requires_grad) in the same order, and fails on every rank with the same InvalidArgument naming
// the first entry that differs — before any gradient collective could hang:
//
//   InvalidArgument: replicate over group 'dp' (4 ranks): the ranks hold different models: entry
//   5 is parameter 'transformer.h.0.attn.c_attn.weight' f32[96, 32] on rank 0 but parameter
//   'transformer.h.0.attn.c_attn.weight' f32[72, 32] on rank 2; ...
//
// Every rank must run each synced backward through the module (so its end-of-backward callback
// runs). Buffers are broadcast from rank 0 at construction only (no per-forward buffer sync).
// Buckets are laid out at construction: move or convert the module (to(), set_parameter()) before
// replicate(), not after. The buckets hold a second copy of the gradients.
//
// Thread-safety: none. Like the module, a DDPModule and its hooks are used by the one thread that
// runs the module's forward and backward; the group's worker thread only reads the bucket buffers
// it was handed, and results are read after Work::wait. Ownership: the DDPModule does not own the
// module, which must outlive it; it owns its buckets and shares the process group with the mesh.
// Destroying (or moving from) a DDPModule removes its module hooks and turns its parameter hooks
// into no-ops; the module then trains without communication.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/base/clock.h"
#include "tessel/collectives/process_group.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/module.h"

namespace tessel {

struct ReplicateOptions {
  // The mesh dimension whose ranks are the replicas (the data-parallel group). Empty: the mesh's
  // only dimension; a mesh of several dimensions must name one (HSDP's "dp_replicate", say).
  std::string dim = {};
  // Gradient bytes per bucket (PyTorch's bucket_cap_mb, 25 MiB). A parameter larger than this
  // gets a bucket of its own. Smaller buckets start communication earlier in backward, with more
  // calls; one bucket per parameter is bucket_bytes = 1.
  int64_t bucket_bytes = int64_t{25} << 20;
  // Broadcast the parameters and buffers of the group's rank 0 at construction (one call per
  // dtype), so replicas start equal even when ranks initialised differently.
  bool broadcast_from_rank0 = true;
  // Timeout of every collective replicate() issues and of the waits at the end of backward;
  // zero: the group's default.
  Nanoseconds timeout{0};
};

// What a DDPModule has done so far.
struct DDPStats {
  int64_t synced_backwards = 0;     // backward passes that averaged gradients
  int64_t all_reduces = 0;          // bucket all_reduces issued
  int64_t started_in_backward = 0;  // of those, started from gradient hooks while backward ran
  Nanoseconds exposed_wait{0};      // time blocked waiting for buckets at the ends of backward
};

// One bucket: parameters in fill order (reverse of named_parameters()).
struct DDPBucket {
  DType dtype = DType::kF32;
  int64_t numel = 0;  // gradient elements
  std::vector<std::string> parameters;
};

// The handle replicate() returns. Movable, not copyable.
class DDPModule {
 public:
  DDPModule(DDPModule&& other) noexcept;
  DDPModule& operator=(DDPModule&& other) noexcept;
  DDPModule(const DDPModule&) = delete;
  DDPModule& operator=(const DDPModule&) = delete;
  ~DDPModule();

  // The wrapped module, and calls through it (its hooks do the work; calling the module
  // directly is the same).
  nn::Module& module() const { return *module_; }
  nn::Tensors operator()(const nn::Tensors& inputs) const { return (*module_)(inputs); }
  Tensor operator()(const Tensor& input) const { return (*module_)(input); }

  // The data-parallel group gradients are averaged over.
  ProcessGroup& group() const;

  // Whether backward passes after the next forward average gradients (default true). With
  // false, gradients accumulate locally and nothing is communicated.
  void set_requires_gradient_sync(bool sync);
  bool requires_gradient_sync() const;
  // Whether the next backward pass averages gradients, whatever the setting was when the
  // module's forward last ran (PyTorch pipelining's reducer.prepare_for_backward). For callers
  // that interleave forwards and backwards of several micro-batches, as the pipeline runtime
  // does: call it just before each backward. Later forwards capture the setting again.
  void set_next_backward_sync(bool sync);

  // Turns gradient sync off for its scope and restores the previous setting (PyTorch's no_sync).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DDPModule& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DDPModule& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // The bucket layout, in the order the buckets' all_reduces are issued.
  std::vector<DDPBucket> buckets() const;
  DDPStats stats() const;

 private:
  friend DDPModule replicate(nn::Module& module, const DeviceMesh& mesh, ReplicateOptions options);
  struct State;
  DDPModule(nn::Module& module, std::shared_ptr<State> state);
  void remove_hooks();

  nn::Module* module_ = nullptr;
  std::shared_ptr<State> state_;
  std::vector<nn::HookHandle> hooks_;  // on module_
};

// Makes `module` data-parallel over the mesh's replicate dimension (see the file comment).
// Collective over the mesh's world (the dimension's group is made on first use) and then over
// that group; every rank calls it with the same options. Throws InvalidArgument, the same on
// every rank: for a mesh without options.dim (or of several dimensions and no dim), a
// non-positive bucket_bytes, or ranks that hold different parameters or buffers.
DDPModule replicate(nn::Module& module, const DeviceMesh& mesh, ReplicateOptions options = {});

}  // namespace tessel
