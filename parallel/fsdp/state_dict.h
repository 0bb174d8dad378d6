#pragma once
// State dicts of a model whose parameters may be DTensors (sharded by fully_shard, split by a
// tensor-parallel style): per rank as DTensors, or gathered whole.
//
//   auto sharded = sharded_state_dict(model, mesh);     // no communication
//   nn::StateDict full = full_state_dict(model);        // collective; rank 0 gets the tensors

#include <string>
#include <utility>
#include <vector>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/module.h"
#include "tessel/parallel/dtensor/dtensor.h"

namespace tessel {

// Every parameter and buffer by name: sharded parameters as DTensors, the rest replicated over
// `mesh` (each rank's own values). No communication.
std::vector<std::pair<std::string, DTensor>> sharded_state_dict(nn::Module& model,
                                                                const DeviceMesh& mesh);
// The whole parameters and buffers by name, gathered (a collective over every sharded
// parameter's mesh); with rank0_only, ranks other than 0 get an empty map.
nn::StateDict full_state_dict(nn::Module& model, bool rank0_only = true);

}  // namespace tessel
