#pragma once
// What the FSDP trace tests share (fake backend on the CPU, NCCL on a GPU): a GPT sharded block
// by block, this process's flight recorder dumped and exported as tessel-trace export --perfetto
// writes it, its complete slices read back from the JSON, and the all_gathers among them that
// ran while a block computed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/mesh/device_mesh.h"
#include "tessel/nn/gpt.h"

namespace tessel::testing {

// A GPT built on the meta device, fully_shard'ed per block and then at the root over `mesh`,
// materialised on `device` and initialised.
std::unique_ptr<nn::GPT> sharded_gpt(const nn::GptConfig& config, const DeviceMesh& mesh,
                                     Device device);

// One complete ("X") event of the exported trace, in wall-clock microseconds.
struct TraceSlice {
  std::string track;     // its thread track's name: "compute", "compute 2", "group dp", ...
  std::string name;      // "fsdp forward transformer.h.1", "all_gather #7 (dp)", ...
  std::string category;  // the entry's op: "user_span", "all_gather", ...
  double begin_us = 0, end_us = 0;
};

// The global flight recorder dumped as rank `rank` of `world_size`, exported with
// export_perfetto and parsed back: the slices of entries recorded after record `after`.
// Fails the test (and returns nothing) when the ring no longer holds them all.
std::vector<TraceSlice> exported_slices(uint64_t after, int rank, int world_size);

// "all_gather #7 (dp) during fsdp forward transformer.h.1" for every all_gather slice that
// overlaps a compute-track span of a block ("fsdp ... transformer.h.<i>"; the root's spans
// enclose whole passes, so they would prove nothing).
std::vector<std::string> gathers_during_block_compute(const std::vector<TraceSlice>& slices);

}  // namespace tessel::testing
