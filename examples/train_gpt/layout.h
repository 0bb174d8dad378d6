// How train_gpt's ranks split the work: the device each trains on, the world process group and
// the mesh of data-parallel and tensor-parallel dimensions.
#pragma once

#include <cstdint>
#include <memory>

#include "flags.h"
#include "tessel/base/launch_env.h"
#include "tessel/collectives/process_group.h"
#include "tessel/mesh/device_mesh.h"
#include "tessel/tensor/device.h"

namespace tessel::train_gpt {

// Where this process trains: --device, with "cuda" meaning cuda:LOCAL_RANK under a launcher
// (one GPU per process). Fails with the reason when CUDA is asked for and none is usable.
Device training_device(const Flags& f, const LaunchEnv& env);

// How the ranks split the work: a mesh (dp_replicate, dp_shard[, cp][, tp]) over the world, and
// this rank's slice of the global batch (the same for every rank of a cp or tp group).
struct Layout {
  std::shared_ptr<ProcessGroup> world;
  std::unique_ptr<DeviceMesh> mesh;
  int64_t replicate = 1, shard = 1, cp = 1, tp = 1;  // mesh sizes
  int64_t batch_index = 0;                           // this rank's slice of the global batch
  int64_t batch_parts = 1;
};

// The world's backend follows the device: NCCL for CUDA, Gloo (or MPI) for the CPU.
Layout make_layout(const Flags& f, Device device);

// The mean of `value` over the world (for logging the global loss), through the world's
// device (NCCL moves GPU memory only).
// Every rank calls it, every step.
double world_mean(ProcessGroup* world, double value);

}  // namespace tessel::train_gpt
