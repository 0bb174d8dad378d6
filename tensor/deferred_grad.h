#pragma once
// Deferred weight gradients: a backward pass that computes input gradients now and leaves the
// weight gradients for later (zero-bubble pipeline schedules' split of B and W; Megatron's
// WeightGradStore).
//
//   DeferredWeightGrads store;
//   {
//     DeferWeightGradsGuard defer(&store);
//     backward(loss);   // B: linear's input gradient now; its weight/bias gradients queued
//   }                   // weights' grad() unchanged, store.size() > 0
//   store.run();        // W: computes the queued gradients, accumulates them into grad()
//
// Which ops defer: linear (nn::Linear and the LM head) whose weight is a leaf; its bias, when
// it is a leaf, goes with it. Everything else (embedding, norms, matmul of two activations)
// computes its gradients immediately. run() accumulates through the path backward() uses (the
// leaf's gradient hooks, then grad(), then its post-accumulate-grad hooks, in queue order), so
// a weight reached once per pass gets bit-identical gradients; hooks fire in run(), not in the
// deferring pass. A data-parallel wrapper that reduces when all its parameters' gradients of a
// pass are ready (FSDP) does not see them in one pass: do not defer its modules.
// A queued computation holds its op's input and output gradient as they were (views, not
// copies): do not overwrite them (a reused receive buffer) before run().
//
// Thread-safety: none; a store is used by one thread. A guard installs it on its thread only.

#include <functional>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel {

class DeferredWeightGrads {
 public:
  // Computes the gradients of `leaves` (one each, undefined where none) when run.
  using Compute = std::function<std::vector<Tensor>()>;

  DeferredWeightGrads() = default;
  DeferredWeightGrads(const DeferredWeightGrads&) = delete;
  DeferredWeightGrads& operator=(const DeferredWeightGrads&) = delete;

  // Queued computations not run yet.
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // How many computations were ever queued (for tests and counts of work moved).
  int64_t deferred_total() const { return deferred_total_; }

  // Runs every queued computation in queue order, each with grad mode and autocast off, and
  // accumulates its results into its leaves as backward() does; then empties the store.
  // Blocking, on the calling thread; queue_callback() works inside hooks and runs at the end.
  void run();
  // Drops the queued computations and what they hold (saved inputs and output gradients).
  void clear() { entries_.clear(); }

  // For ops: queues `compute` for `leaves` (leaves that require a gradient).
  void defer(std::vector<Tensor> leaves, Compute compute);

 private:
  struct Entry {
    std::vector<Tensor> leaves;
    Compute compute;
  };
  std::vector<Entry> entries_;
  int64_t deferred_total_ = 0;
};

// Installs `store` (null: none) on this thread for its scope; restores the previous one.
class DeferWeightGradsGuard {
 public:
  explicit DeferWeightGradsGuard(DeferredWeightGrads* store);
  ~DeferWeightGradsGuard();
  DeferWeightGradsGuard(const DeferWeightGradsGuard&) = delete;
  DeferWeightGradsGuard& operator=(const DeferWeightGradsGuard&) = delete;

 private:
  DeferredWeightGrads* previous_;
};

// The store installed on this thread, or null (ops then compute every gradient at once).
DeferredWeightGrads* deferred_weight_grads();

}  // namespace tessel
