#pragma once
// What the tensor-parallel parity tests share across backends (rank threads, forked Gloo
// processes): a small GPT whose vocabulary splits unevenly, learnable global batches, training
// it on one process and on one rank of a (dp..., tp) mesh, recording every step's loss and the
// first step's whole gradients, and the comparison with its tolerances.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/collectives/process_group.h"
#include "tessel/nn/gpt.h"

namespace tessel::testing {

// 2 layers, 4 heads, width 32, context 16, vocabulary 66 (17, 17, 17, 15 over 4 ranks).
nn::GptConfig tp_gpt_config();

struct TpRun {
  std::vector<float> losses;                  // the global loss of every step
  std::map<std::string, Tensor> first_grads;  // the whole gradient of step 0, by name
};

// `steps` AdamW steps (with clipping at 1) on the whole global batches, on `device`.
TpRun train_single_process(int steps, Device device = Device::cpu());

struct TpSetup {
  std::vector<int64_t> shape;  // of the mesh
  // "tp" last; dp_shard / dp_replicate before it; "cp" (context parallelism of the GPT, FSDP
  // then over dp_shard and cp flattened) before "tp"
  std::vector<std::string> names;
  bool sequence_parallel = false;
  int64_t overlap_chunks = 0;
  int steps = 20;
  Device device = Device::cpu();  // where the model is split and trains
  bool ddp = false;               // replicate (DDP) over the dimensions before "tp" instead of FSDP
};

// One rank's training under gpt_tp_plan (then FSDP over the dimensions before "tp"): every rank
// of the world calls it. The losses are averaged over the world; the gradients gathered (a
// collective), so every rank returns the whole run.
TpRun train_tensor_parallel(const std::shared_ptr<ProcessGroup>& world, const TpSetup& setup);
// train_tensor_parallel on rank threads (threads backend), one per rank of the mesh; rank 0's run.
TpRun train_tensor_parallel_threads(const TpSetup& setup);

// The first difference beyond the tolerances — a step's loss off by more than loss_rtol
// (relative), a first-step gradient off by more than grad_tol of its largest entry — or empty.
// Also fails when the single run did not learn (so parity cannot hide behind ln V). The runs
// may be on different devices (gradients are compared on the CPU).
std::string parity_error(const TpRun& got, const TpRun& want, double loss_rtol = 1e-5,
                         double grad_tol = 1e-5);

// parity_error of train_tensor_parallel_threads(setup) against single-process training of as
// many steps on the CPU (one single run per step count, kept for the process's lifetime).
std::string threads_parity_error(const TpSetup& setup);

}  // namespace tessel::testing
