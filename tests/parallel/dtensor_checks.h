#pragma once
// The DTensor property check every backend's test runs on each rank: random meshes over the
// world (1-D to 3-D, sizes 1 and odd ones included), random global shapes (dims smaller than the
// mesh, zero-sized ones), random dtypes, random pairs of placements and shard orders. Every
// redistribution's result and every full_tensor() must equal a single-process model of the
// global tensor bit for bit (values are small integers, so partial sums are exact). Throws
// testing::CheckFailure naming the case on any mismatch.

#include <cstdint>
#include <memory>

#include "tessel/collectives/process_group.h"

namespace tessel::testing {

// `cases` random cases drawn from `seed` (every rank must pass the same seed and count), with
// the local tensors on `device` (the single-process model stays on the CPU).
void check_random_redistributions(const std::shared_ptr<ProcessGroup>& world, uint64_t seed,
                                  int cases, Device device = Device::cpu());

}  // namespace tessel::testing
