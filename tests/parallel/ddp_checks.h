#pragma once
// What the DDP tests share across backends (rank threads, forked Gloo processes): a small GPT,
// deterministic global batches split by rank, and three ways to train it for some steps — one
// process on the whole batch, one process accumulating the ranks' micro-batches in rank order,
// and one rank of replicate() — each recording the loss and gradients of every step.

#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/collectives/process_group.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/fsdp/ddp.h"

namespace tessel::testing {

// 2 layers, 2 heads, width 32, vocabulary 64, context 16.
nn::GptConfig ddp_gpt_config();

struct Batch {
  Tensor x, y;
};

// Step `step`'s global batch of `batch` sequences of `seq` tokens: arithmetic progressions mod
// `vocab` (a random start, a stride of 1 to 3), so the model learns and the loss falls. The
// default 12 sequences split evenly over 1, 2, 3 and 4 ranks.
Batch global_batch(int64_t step, int64_t batch = 12, int64_t seq = 16, int64_t vocab = 64);
// Rank `rank`'s rows of a batch split `world` ways.
Batch slice_of(const Batch& b, int rank, int world);

// Every parameter's gradient (zeros where undefined), or value, concatenated in name order.
std::vector<float> flat_grads(const nn::Module& m);
std::vector<float> flat_params(const nn::Module& m);
// Largest |a - b| over the largest |b|; infinity when the sizes differ.
double relative_diff(const std::vector<float>& a, const std::vector<float>& b);

// A training run with AdamW: per step the (global) loss and every gradient, then the final
// parameters.
struct Trajectory {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  std::vector<float> params;
  int64_t synced_backwards = 0;  // replicate() runs only
};

// One process, the whole global batch per step.
Trajectory train_whole_batch(int64_t steps);
// One process, the global batch as `world` micro-batches whose gradients accumulate in rank
// order and are then divided by `world`: the order in which the threads backend's (and, for two
// ranks, any backend's) all_reduce(avg) adds the ranks' gradients.
Trajectory train_accumulated(int world, int64_t steps);
// This rank's run of replicate() over a 1-D mesh of `world`, on its slice of each global batch;
// the loss recorded is the ranks' average.
Trajectory train_replicated_rank(const std::shared_ptr<ProcessGroup>& world, int64_t steps,
                                 ReplicateOptions options = {});

}  // namespace tessel::testing
