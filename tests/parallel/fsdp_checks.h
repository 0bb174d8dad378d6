#pragma once
// What the FSDP parity tests share across devices and backends (rank threads on the CPU or on
// CUDA tensors, NCCL): a small GPT whose rows split unevenly over 4 ranks, learnable global
// batches, plain single-process training on them, and the same training under fully_shard on
// one rank of a mesh, each returning every step's loss.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/collectives/process_group.h"
#include "tessel/nn/gpt.h"
#include "tessel/parallel/fsdp/fsdp.h"

namespace tessel::testing {

// 2 layers, 2 heads, width 30 (rows that 4 ranks split unevenly), vocabulary 64, context 16.
nn::GptConfig fsdp_gpt_config();
inline constexpr int64_t kFsdpBatch = 12;  // global batch; every world size here divides it
inline constexpr int kFsdpSteps = 20;

// The global batch of step `step` on the CPU: inputs and next-token targets, the same on every
// rank. Sequences count up in steps of 3 from a random start, so the loss has something to learn
// (on random tokens it would stay at ln 64 and hide differences).
std::pair<Tensor, Tensor> fsdp_batch_of(int step);

// Losses of plain single-process training on `device` (micro: that many backward passes per
// step, each on a slice, gradients summed).
std::vector<float> train_single(int micro = 1, Device device = Device::cpu());

struct FsdpSetup {
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_names;
  FullyShardOptions options;
  int micro = 1;                  // backward passes per step (sync only on the last)
  bool hsdp_accumulate = false;   // HSDP: skip the replicas' all_reduce on all but the last
  bool autocast = false;          // forward and loss under AutocastGuard(DType::kBF16)
  Device device = Device::cpu();  // where the model is sharded and trains
};

// One rank's training under FSDP over a mesh on `world` (every rank calls it): the mean over
// ranks of each rank's loss on its slice of the batch, per step.
std::vector<float> train_fsdp_rank(const std::shared_ptr<ProcessGroup>& world,
                                   const FsdpSetup& setup);
// train_fsdp_rank on rank threads (threads backend); rank 0's losses.
std::vector<float> train_fsdp(const FsdpSetup& setup);

// Every step's loss within rtol (relative) of the reference's (gtest expectations).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol);

}  // namespace tessel::testing
